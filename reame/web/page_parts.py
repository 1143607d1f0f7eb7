"""Pieces of the page that are not about chats: its CSS, a closed panel of fields, and reading
what the page's fields hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import gradio as gr

CSS = """
.reame-stats { font-size: 0.75em; opacity: 0.65; margin-top: 0.4em; }
.reame-window { font-size: 0.75em; opacity: 0.65; margin-top: 0.6em; padding-top: 0.3em;
                border-top: 1px dashed currentColor; text-align: center; }
.reame-panel { border: var(--block-border-width) solid var(--block-border-color);
               border-radius: var(--block-radius); padding: var(--block-padding);
               background: var(--block-background-fill); gap: var(--size-2) !important; }
.reame-panel-toggle { justify-content: space-between !important; background: none !important;
                      border: none !important; box-shadow: none !important; padding: 0 !important;
                      min-height: 0 !important; color: var(--accordion-text-color) !important;
                      font-size: var(--section-header-text-size) !important;
                      font-weight: var(--section-header-text-weight) !important; }
.reame-panel-toggle::after { content: "\\25BC"; transform: rotate(90deg); transition: 150ms; }
.reame-panel[data-open=true] .reame-panel-toggle::after { transform: rotate(0); }
.reame-panel:not([data-open=true]) .reame-panel-body { display: none !important; }
html[data-reame-role=user] #settings-tab-button { display: none !important; }
#model-error { border: 1px solid var(--error-border-color, #f87171); border-radius: 8px;
               padding: 0.5em 1em; background: var(--error-background-fill, #fef2f2); }
"""

HIDDEN = dict(api_visibility="private")
ROLE_JS = "(role) => { document.documentElement.dataset.reameRole = role; }"


@contextmanager
def panel(label: str, elem_id: str) -> Iterator[None]:
    """A closed section that the user opens and closes, its fields rendered with the page.

    Not gr.Accordion(open=False): Gradio renders a closed accordion's fields on its first
    opening, and a frame later sets them once more from the values the server last sent
    (render_previously_invisible_children in its init.svelte.ts), which wiped a value the
    user had typed in that moment (the stop test in tests/test_page_send.py, 1 run in ~20 on
    a busy machine). Opening and closing this one is the page's alone: no server call."""
    with gr.Column(elem_id=elem_id, elem_classes=["reame-panel"]):
        toggle = gr.Button(label, size="sm", elem_classes=["reame-panel-toggle"])
        with gr.Column(elem_classes=["reame-panel-body"]):
            yield
    toggle.click(None, None, None, js=f"""() => {{
        const panel = document.getElementById({elem_id!r});
        const open = panel.dataset.open !== "true";
        panel.dataset.open = open;
        panel.querySelector(".reame-panel-toggle").setAttribute("aria-expanded", open);
    }}""", **HIDDEN)


def panel_js(n_before: int) -> str:
    """An event's js: its last four inputs (the chat settings panel) read from the page itself.

    Gradio hands a number or text field's new value to its own state a moment after the
    keystroke (an effect), while a blur, or an Enter in the message box right after, sends
    the state as it is. The fields in the page always hold what the user sees."""
    return f"""(...args) => {{
        const field = (sel) => document.querySelector(sel);
        const text = (sel, old) => field(sel) ? field(sel).value : old;
        const number = (sel, old) => {{
            const x = parseFloat(text(sel, ""));
            return Number.isFinite(x) ? x : old;
        }};
        const [prompt, temp, top, maxTok] = args.slice({n_before});
        return [...args.slice(0, {n_before}),
                text("#system-prompt textarea", prompt),
                number("#temperature input[type=number]", temp),
                number("#top-p input[type=number]", top),
                number("#max-tokens input", maxTok)];
    }}"""


def flatten(value) -> str:
    """Message content from the Chatbot: a string, or a list of blocks with text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(flatten(v) for v in value)
    if isinstance(value, dict):
        return str(value.get("text", ""))
    return str(value or "")
