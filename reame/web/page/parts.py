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

# The page's styles (page.css; users.css adds the Users tab's), read once at start.
CSS = (Path(__file__).parent / "page.css").read_text(encoding="utf-8")

# Runs once when the page loads (mount_gradio_app's js): the chat list's grouping and keys,
# the buttons inside messages, the keyboard shortcuts, copying without the stats line
# (page.js); then the page's edges: a login that ended, a file not taken (page_edges.js);
# the shortcuts' help (shortcuts.js); files dropped on the box attached (drop_files.js).
PAGE_JS = "() => {\n" + "".join(
    f"    ({(Path(__file__).parent / name).read_text(encoding='utf-8').strip()})();\n"
    for name in ("page.js", "page_edges.js", "shortcuts.js", "drop_files.js")) + "}"
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
# Once a chat is shown: follow the reply being written in it, if any (sending.py, follow).
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
    user had typed in that moment (the stop test in tests/web/page/test_page_send.py, 1 run in ~20 on
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
