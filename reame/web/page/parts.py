"""Pieces of the page that are not about chats: its CSS, a closed panel of fields, and reading
what the page's fields hold."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
from gradio.data_classes import FileData
from gradio.utils import NamedString

CSS = """
.reame-stats { font-size: 0.75em; opacity: 0.85; margin-top: 0.4em; }
/* The stats line: its words, then "Details" on the same line; opened, the figures below. */
.reame-stats details.reame-stats-more { display: inline; }
.reame-stats details.reame-stats-more > summary { display: inline; cursor: pointer;
    text-decoration: underline dotted; list-style: none; }
.reame-stats details.reame-stats-more > summary::-webkit-details-marker { display: none; }
.reame-stats details.reame-stats-more[open] .reame-stats-tech { display: block;
    margin-top: 0.2em; }
.reame-window { font-size: 0.75em; opacity: 0.85; margin-top: 0.6em; padding-top: 0.3em;
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
.reame-offscreen { display: none !important; }
.reame-tools { display: flex; align-items: center; gap: 0.35em; margin-top: 0.5em;
               font-size: 0.8em; }
.reame-tool { border: 1px solid var(--border-color-primary); border-radius: 6px;
              padding: 0.1em 0.55em; background: none; color: inherit; cursor: pointer;
              min-height: 1.9em; min-width: 1.9em; }
.reame-tool.reame-off { opacity: 0.35; cursor: default; border-color: transparent; }
button.reame-tool:hover { background: var(--background-fill-secondary); }
.reame-sr { position: absolute; width: 1px; height: 1px; overflow: hidden;
            clip: rect(0 0 0 0); white-space: nowrap; }
/* Only the list scrolls: the sidebar is the window's height, and the list takes what the
   buttons above it and the panels below it (Log out last) leave. */
#sidebar .sidebar-content { height: 100%; box-sizing: border-box; display: flex;
                            flex-direction: column; }
#sidebar .sidebar-content > .column { flex: 1 1 auto; min-height: 0; }
#sidebar .sidebar-content > .column > * { flex: none; }
#chat-list { flex: 0 1 auto !important; min-height: 8rem; overflow-y: auto !important; }
#transfer-row { flex-wrap: nowrap !important; gap: 0.5rem; }
#transfer-row > * { min-width: 0 !important; flex: 1 1 0 !important; }
.reame-chats ul { list-style: none; margin: 0; padding: 0; }
h3.reame-group { font-size: 0.75em; font-weight: 600; opacity: 0.85; margin: 0.9em 0.4em 0.2em;
                 text-transform: none; }
.reame-row { display: flex; align-items: center; border-radius: 8px; position: relative; }
.reame-row:hover, .reame-row:has([aria-current]) { background: var(--background-fill-secondary); }
.reame-open { flex: 1 1 auto; min-width: 0; text-align: left; background: none; border: none;
              color: inherit; padding: 0.45em 0.5em; cursor: pointer; border-radius: 8px;
              display: flex; flex-direction: column; font-size: 0.9rem; font-weight: normal; }
.reame-open[aria-current] { font-weight: 600; }
.reame-title { font-size: 0.9rem; }
.reame-title, .reame-snippet { display: block; overflow: hidden; white-space: nowrap;
                               text-overflow: ellipsis; max-width: 100%; }
.reame-snippet { font-size: 0.8em; opacity: 0.85; font-weight: normal; }
.reame-snippet mark { background: var(--color-accent-soft, #fde68a); color: inherit; }
.reame-writing { display: block; font-size: 0.8em; font-weight: normal;
  color: var(--color-accent, #2563eb); }
.reame-writing span { animation: reame-pulse 1.2s ease-in-out infinite; }
@keyframes reame-pulse { 50% { opacity: 0.3; } }
@media (prefers-reduced-motion: reduce) { .reame-writing span { animation: none; } }
.reame-menu summary { list-style: none; cursor: pointer; padding: 0.3em 0.55em;
                      border-radius: 6px; opacity: 0.85; }
.reame-menu summary::-webkit-details-marker { display: none; }
.reame-menu summary:hover, .reame-menu[open] summary { opacity: 1;
                      background: var(--background-fill-primary); }
/* Placed by page.js over the page, outside the list's scroll box (hidden until placed). */
.reame-menu-items { position: fixed; z-index: 50; display: flex;
                    flex-direction: column; min-width: 11em; padding: 0.3em;
                    background: var(--background-fill-primary); border-radius: 8px;
                    border: 1px solid var(--border-color-primary);
                    box-shadow: 0 4px 16px rgba(0, 0, 0, 0.18); }
.reame-menu-items:not([data-placed]) { visibility: hidden; }
.reame-menu-items button { text-align: left; background: none; border: none; color: inherit;
                           padding: 0.45em 0.6em; border-radius: 6px; cursor: pointer; }
.reame-menu-items button:hover { background: var(--background-fill-secondary); }
.reame-danger { color: var(--error-text-color, #dc2626) !important; }
.reame-archived-tag { display: inline-block; font-size: 0.75em; font-weight: normal;
                      opacity: 0.85; border: 1px solid currentColor; border-radius: 4px;
                      padding: 0 0.3em; margin-top: 0.15em; align-self: flex-start; }
.reame-archived-link { background: none; border: none; color: inherit; cursor: pointer;
                       font-size: 0.8em; text-decoration: underline; margin: 0.4em; padding: 0; }
.reame-attachments { list-style: none; margin: 0; padding: 0; display: flex; flex-wrap: wrap;
                     gap: 0.4em; }
.reame-attached { display: flex; align-items: flex-start; gap: 0.2em; max-width: 100%;
                  border: 1px solid var(--border-color-primary); border-radius: 6px;
                  padding: 0.1em 0.4em; font-size: 0.85em; }
.reame-attached pre, .reame-doc pre { max-height: 16em; overflow: auto; white-space: pre-wrap;
                                      font-size: 0.85em; }
.reame-detach { background: none; border: none; color: inherit; cursor: pointer; }
.reame-rename { flex: 1 1 auto; min-width: 0; margin: 0.2em; padding: 0.3em 0.4em; }
#reame-hint { font-size: 0.85em; min-height: 1.2em; margin: 0.2em 0.4em; }
#reame-busy { font-size: 0.85em; opacity: 0.85; min-height: 1.2em; margin: 0.2em 0.4em; }
#reame-busy:not(:empty)::before { content: "● "; animation: reame-pulse 1.2s ease-in-out
                                     infinite; }
@media (prefers-reduced-motion: reduce) { #reame-busy::before { animation: none; } }
@media (max-width: 768px) {
    /* A finger-sized sidebar button, inside the screen. */
    .sidebar .toggle-button { width: 44px !important; height: 44px !important; }
    .sidebar:not(.open) .toggle-button { transform: translateX(8px); }
}
#account { font-size: 0.85em; }
/* Readable against the page (WCAG AA, checked by axe-core in tests/test_page_access.py):
   the primary button's white text, and Gradio's footer. */
#new-chat { background: #c2410c !important; border-color: #c2410c !important; color: #fff; }
footer, footer a, footer button { color: #52525b !important; }
.dark footer, .dark footer a, .dark footer button { color: #d4d4d8 !important; }
.reame-list-note { font-size: 0.8em; opacity: 0.85; margin: 0.6em 0.4em; }
#chat-note:not(:has(.reame-note)) { display: none !important; }
.reame-note { margin: 0; padding: 0.4em 0.8em; border-radius: 8px; font-size: 0.9em;
              border: 1px solid var(--border-color-primary);
              background: var(--background-fill-secondary); }
"""

# Runs once when the page loads (mount_gradio_app's js): the chat list's grouping and keys,
# the buttons inside messages, the keyboard shortcuts, copying without the stats line.
PAGE_JS = (Path(__file__).parent / "page.js").read_text(encoding="utf-8")
# Saves what an export returned ({"name", "type", "text"}) as a file in the browser.
DOWNLOAD_JS = """(payload) => {
    if (!payload) return;
    const {name, type, text} = JSON.parse(payload);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([text], {type}));
    link.download = name;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}"""


def download_payload(file: dict) -> str:
    """A file for DOWNLOAD_JS to save: the same export twice is still a change (its time)."""
    return json.dumps({**file, "at": time.time()})


HIDDEN = dict(api_visibility="private")
# After a chat is opened, made or changed from the list or a message: typing goes on there
# (and on a phone, the sidebar makes way for the chat).
FOCUS_MESSAGE_JS = """() => {
    window.reameCloseSidebarOnPhone?.();
    document.querySelector('#message textarea')?.focus();
}"""
ROLE_JS = "(role) => { document.documentElement.dataset.reameRole = role; }"
# Once a chat is shown: follow the reply being written in it, if any (page.follow).
# The Chatbot's trash icon: delete the chat shown, asking first as the list's Delete does; when
# the person says no, the chat is shown again (the Chatbot has emptied its view already).
# (The chat's id is the list's selected row's: a State reaches the browser as null.)
CLEAR_JS = """(action, chat) => {
    const row = document.querySelector('#chat-list .reame-open[aria-current=page]');
    const id = row ? row.dataset.reameAction.split(':')[1] : '';
    if (!id) return ['', chat];
    const sure = window.confirm(
        `Delete “${row.dataset.title}” and all its messages? This cannot be undone.`);
    return [`${sure ? 'delete' : 'open'}:${id}`, chat];
}"""
_CLICK_FOLLOW = "document.getElementById('reame-follow-btn')?.click();"
FOLLOW_JS = f"() => {{ {_CLICK_FOLLOW} }}"
REFOLLOW_JS = f"(again) => {{ if (again) {_CLICK_FOLLOW} }}"  # end_send's refollow output
# The address bar: the page's load asks for the chat it names (?chat=ID); once a chat is
# shown, it names that one (page.js, reameShowUrl).
ASKED_JS = "(shown) => [new URLSearchParams(location.search).get('chat') || '']"
SHOW_URL_JS = "(shown) => { window.reameShowUrl?.(shown); }"


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



def import_button(label: str, *, file_types: list[str], **kwargs) -> gr.UploadButton:
    """Gradio's UploadButton handing its event the uploaded file's path, without the empty temp
    file Gradio 6's own preprocessing leaves in its upload folder at every upload (never
    deleted). The event reads the file through the upload ledger (uploads.py). (Set on the
    instance: a subclass of a Gradio component writes a .pyi file beside this module.)"""
    button = gr.UploadButton(label, file_types=file_types, **kwargs)

    def path_only(f: FileData) -> NamedString:
        if not any(f.path.lower().endswith(kind.lower()) for kind in file_types):
            raise gr.Error(f"Only {', '.join(file_types)} files can be uploaded here.",
                           print_exception=False)
        named = NamedString(f.path)
        named.orig_name = f.orig_name  # the name the person's file had (a document's name)
        return named

    button._process_single_file = path_only
    return button
