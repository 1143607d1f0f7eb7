"""The Gradio page: its layout and the wiring of its events to the handlers (sending.py:
thin handlers over ChatService; they take state and return state)."""

from __future__ import annotations

import html
import logging
from collections.abc import Callable

import gradio as gr

from reame.admin.live_settings import Settings
from reame.chats.documents import KINDS
from reame.chats.service import ChatService
from reame.config.chat_settings import FIELD
from reame.web.http.uploads import Uploads
from reame.web.http.user import user_of
from reame.web.page.attachments import Attachments
from reame.web.page.instructions_panel import InstructionsPanel
from reame.web.page.live_replies import LiveReplies
from reame.web.page.parts import (
    ASKED_JS,
    CLEAR_JS,
    DOWNLOAD_JS,
    FOCUS_MESSAGE_JS,
    FOLLOW_JS,
    HIDDEN,
    REFOLLOW_JS,
    ROLE_JS,
    SHOW_URL_JS,
    import_button,
    panel,
    panel_js,
)
from reame.web.page.sending import PageHandlers
from reame.web.page.settings_tab import banner_texts, build_settings_tab, cache_markdown
from reame.web.page.users_panel import UsersPanel

log = logging.getLogger(__name__)

STEP = 0.05  # of the sliders


# The events that draw the chat list from a chat open at the time they were sent: answered one
# at a time, in the order they were sent.
LIST_LINE = dict(concurrency_id="chat-list", concurrency_limit=1)

def _range(name: str) -> tuple[float, float]:
    """A chat setting's range for a slider (an open end starts one step in)."""
    field = FIELD[name]
    return field.minimum + (STEP if field.low_open else 0), field.maximum


def build_page(demo: gr.Blocks, service: ChatService, *, settings_group: str,
               settings: Settings | None = None, title: str = "Reame",
               can_configure: Callable[[str | None], bool] = lambda user: True,
               name_of: Callable[[str | None], str | None] = lambda user: None,
               uploads: Uploads | None = None, unwatched_s: float = 10,
               users: UsersPanel | None = None) -> None:
    """The page, built into demo (the Blocks being defined). Settings changes run one at a time
    (the concurrency group settings_group); turns, any number at once (the service's scheduler
    lines them up). can_configure(user) says who may change the settings (with accounts:
    admins); name_of(user) is the name a logged-in user goes by (None: no accounts).
    Replies go on being written when the page shows another chat (live_replies); one that no
    open tab watches is stopped after unwatched_s. users: the admin's Users tab and note
    (with accounts)."""
    live = LiveReplies(unwatched_s)
    current = gr.State(None)  # the chat shown, by id
    pending = gr.State("")  # the message being sent (the textbox clears at once)
    # The chats of the user whose reply is being written, as the list last showed them.
    listed_writing = gr.State((frozenset(), frozenset()))

    with gr.Sidebar(open=True, elem_id="sidebar"):
        gr.Markdown(f"### {title}")
        new_btn = gr.Button("+ New chat", variant="primary", elem_id="new-chat")
        search = gr.Textbox(label="Search chats", show_label=False, container=False,
                            placeholder="Search chats (Ctrl+K)", max_lines=1,
                            elem_id="chat-search")
        if users is not None:  # an admin's note: the chats from before accounts, to adopt
            users.build_note()
        chat_list = gr.HTML(elem_id="chat-list", padding=False)
        with gr.Row(elem_id="transfer-row"):
            import_btn = import_button("Import", file_types=[".json"], size="sm",
                                       elem_id="import-chats")
            export_all_btn = gr.Button("Export all", size="sm", elem_id="export-all")
        # The cache in one line of plain words, its figures on demand (cache_markdown).
        cache_md = gr.HTML(elem_id="cache-stats", padding=False)
        account = gr.HTML(elem_id="account", padding=False)  # who is signed in; Log out

    # What a button inside a message asks (render.message_tools), sent by PAGE_JS.
    action = gr.Textbox(elem_id="reame-action", elem_classes=["reame-offscreen"],
                        show_label=False, container=False)
    action_btn = gr.Button("Message action", elem_id="reame-action-btn",
                           elem_classes=["reame-offscreen"])
    # Follows the reply of the chat shown, if one is being written (FOLLOW_JS clicks it once
    # a chat is shown).
    # Continue under a reply cut at Max tokens (render.message_tools; page.js clicks it).
    continue_btn = gr.Button("Continue the reply", elem_id="reame-continue-btn",
                             elem_classes=["reame-offscreen"])
    follow_btn = gr.Button("Follow the reply", elem_id="reame-follow-btn",
                           elem_classes=["reame-offscreen"])
    # Non-empty when a reply's event ended while the chat shown still has a reply being
    # written (end_send): REFOLLOW_JS then follows it again.
    refollow = gr.Textbox(elem_id="reame-refollow", elem_classes=["reame-offscreen"],
                          show_label=False, container=False)
    # The browser's own wait from Enter to the reply's first words (page.js reports it).
    waited = gr.Textbox(elem_id="reame-waited", elem_classes=["reame-offscreen"],
                        show_label=False, container=False)
    waited_btn = gr.Button("Waited", elem_id="reame-waited-btn", elem_classes=["reame-offscreen"])
    # While replies are written in chats not shown, the list is checked for their end.
    list_timer = gr.Timer(2.0, active=False)
    # The chat the address bar names ("" for none): SHOW_URL_JS puts it there.
    shown_id = gr.Textbox(elem_id="reame-shown", elem_classes=["reame-offscreen"],
                          show_label=False, container=False)
    # An export for the browser to save: {"name", "type", "text"} as JSON (DOWNLOAD_JS).
    download = gr.Textbox(elem_id="reame-download", elem_classes=["reame-offscreen"],
                          show_label=False, container=False)

    with gr.Tabs(elem_id="tabs"):
        with gr.Tab("Chat", id="chat", elem_id="chat-tab"):
            # The model line, or why there is none; Apply in the Settings tab updates both.
            info, error = banner_texts(service)
            model_info = gr.Markdown(info, visible=info is not None, elem_id="model-info")
            model_error = gr.Markdown(error, visible=error is not None, elem_id="model-error")
            banner = [model_info, model_error]
            # A short note about the chat asked for (NOT_HERE), until another is shown.
            note = gr.HTML(elem_id="chat-note", padding=False)
            chatbot = gr.Chatbot(elem_id="chatbot", label="Chat", height="65vh",
                                 show_label=False,
                                 editable="user",
                                 sanitize_html=True, render_markdown=True, buttons=["copy"],
                                 feedback_options=None, placeholder="Start a conversation.")
            message = gr.Textbox(placeholder="Message (Enter to send, Shift+Enter for a "
                                             "new line)",
                                 label="Message", show_label=False, lines=1, max_lines=8,
                                 submit_btn=True, stop_btn=False, elem_id="message",
                                 autofocus=True)
            # Documents for the next message (attachments.py): read, shown, removable.
            docs = gr.State([])
            with gr.Row(elem_id="attach-row", equal_height=True):
                attach_btn = import_button("Attach a document", file_types=list(KINDS),
                                           file_count="multiple", size="sm",
                                           variant="secondary", elem_id="attach",
                                           scale=0, min_width=190)
                attached = gr.HTML(elem_id="attached", padding=False)
            detach = gr.Textbox(elem_id="reame-detach", elem_classes=["reame-offscreen"],
                                show_label=False, container=False)
            detach_btn = gr.Button("Remove a document", elem_id="reame-detach-btn",
                                   elem_classes=["reame-offscreen"])
            with panel("Chat settings", "chat-settings"):
                system_prompt = gr.Textbox(label="System prompt", lines=2,
                                           elem_id="system-prompt")
                with gr.Row():
                    temperature = gr.Slider(*_range("temperature"), step=STEP,
                                            label="Temperature", elem_id="temperature")
                    top_p = gr.Slider(*_range("top_p"), step=STEP, label="Top p",
                                      elem_id="top-p")
                    max_tokens = gr.Number(label="Max tokens", precision=0,
                                           minimum=FIELD["max_tokens"].minimum,
                                           maximum=FIELD["max_tokens"].maximum,
                                           elem_id="max-tokens")
            chat_settings = [system_prompt, temperature, top_p, max_tokens]
            instructions = InstructionsPanel(service)
            instructions.build()
        settings_view = None
        if settings is not None:
            with gr.Tab("Settings", id="settings", elem_id="settings-tab"):
                settings_view = build_settings_tab(settings, settings_group=settings_group,
                                                   banner=banner,
                                                   can_configure=can_configure)
        if users is not None:
            with gr.Tab("Users", id="users", elem_id="users-tab"):
                users.build_tab(settings_group=settings_group)

    handlers = PageHandlers(service, live, settings=settings, can_configure=can_configure,
                            uploads=uploads)

    # wiring

    view = [current, chat_list, chatbot, *chat_settings, search, note, shown_id]
    # One load event for the whole page, not queued: a quick read that fills it at once
    # (tests/browser_helpers.py waits for its one /run/predict answer as "page ready").
    show_settings, settings_outputs = settings_view or (lambda request: (), [])
    # "admin" or "user", for the page: a user who may not change the settings does not
    # see the Settings tab (its fields stay empty for them anyway). Not gr.Tab(visible=):
    # an inactive tab is rendered only when opened, so an update to it is not applied.
    role = gr.Textbox(visible=False, elem_id="reame-role")

    def on_load_page(asked: str, request: gr.Request):
        user = user_of(request)
        admin = can_configure(user)
        name = name_of(user)
        signed_in = ("" if name is None else
                     f'Signed in as <strong>{html.escape(name)}</strong> · '
                     '<a href="logout" class="reame-logout">Log out</a>')
        return (*handlers.on_load(asked, request),
                cache_markdown(service, user, whole_server=admin),
                "admin" if admin else "user", signed_in, *instructions.show(request),
                *show_settings(request), *(users.show(request) if users is not None else ()))

    users_outputs = users.outputs if users is not None else []
    # The chat asked for is the address bar's ?chat=ID (read by ASKED_JS). No progress of
    # Gradio's: its timers flashed over the list, the search box and the chat on a busy
    # machine, after the page had already drawn them.
    loaded = demo.load(on_load_page, [shown_id], [*view, cache_md, role, account,
                                                  *instructions.outputs, *settings_outputs,
                                                  *users_outputs],
                       js=ASKED_JS, queue=False, show_progress="hidden", **HIDDEN)
    loaded.then(None, [role], None, js=ROLE_JS, **HIDDEN).then(
        None, None, None, js=FOLLOW_JS, **HIDDEN)
    loaded.then(None, [shown_id], None, js=SHOW_URL_JS, **HIDDEN)

    # Progress and errors only on the textbox, hidden: the Chatbot would show an "Error"
    # badge over the conversation even with show_progress="hidden".
    attachments = Attachments(service, uploads)
    # Any number at once: a PDF waits for its turn among the PDF readers, one per user at a
    # time (attachments.py). Eight at a time (the queue's default) let one person's eight
    # slow PDFs hold up everyone's attachments: a one-line .txt waited 56 s.
    attach_btn.upload(attachments.attach, [attach_btn, docs], [docs, attached],
                      concurrency_limit=None, **HIDDEN).success(
        # A document is read as soon as it is attached, while its question is typed.
        handlers.type_ahead, [message, current, docs], None, queue=False,
        show_progress="hidden", **HIDDEN)
    detach_btn.click(attachments.detach, [detach, docs], [docs, attached, detach], queue=False,
                     **HIDDEN)
    sending = message.submit(
        handlers.begin_send, [message, current, pending, search, docs, *chat_settings],
        [current, pending, chatbot, message, chat_list, docs, attached, note, shown_id],
        validator=handlers.check_send,
        js=panel_js(5), show_progress="hidden", show_progress_on=[message], **HIDDEN,
    )
    sending.then(None, [shown_id], None, js=SHOW_URL_JS, **HIDDEN)
    # No progress text of Gradio's ("processing | 2.3s") over the chat while a reply is
    # written (its "..." bubble stays): page.js says "Writing…" under the box instead.
    streaming = sending.success(
        handlers.stream_reply, [pending, current], [chatbot, message], show_progress="hidden",
        show_progress_on=[chatbot], concurrency_limit=None, **HIDDEN,  # the scheduler's line
    )
    # end_send runs once after the following of a reply ends, however: done, cancelled (a chat
    # switch, a delete) or failed. Not with .then: Gradio 6's page runs a .then after a
    # success or a cancel but not after an error, which left the page saying "writing" over
    # the old reply (the Continue test, in a fresh-clone CI run). A reply still
    # written in the chat shown is then followed again (REFOLLOW_JS): the page takes in its
    # end whatever became of the event.
    after = [chatbot, message, chat_list, pending, cache_md, listed_writing, list_timer,
             refollow]

    def after_reply(event) -> None:
        for ended in (event.success, event.failure):  # a cancel counts as a failure
            ended(handlers.end_send, [current, search], after, queue=False,
                  show_progress="hidden", **HIDDEN).then(
                None, [refollow], None, js=REFOLLOW_JS, **HIDDEN)

    after_reply(streaming)
    # Regenerate (the retry button under the last reply) and edit (a user message), and the
    # following of a reply written in a chat just shown: the message box's Stop stops them too.
    replies = [streaming]
    for trigger, fn in ((chatbot.retry, handlers.regenerate), (chatbot.edit, handlers.edit)):
        reply = trigger(fn, [current], [chatbot, message], show_progress="hidden",
                        show_progress_on=[chatbot], concurrency_limit=None, **HIDDEN)
        after_reply(reply)
        replies.append(reply)
    reply = continue_btn.click(handlers.continue_reply, [action, current], [chatbot, message],
                               js="(action, chat) => [window.reameAction || '', chat]",
                               show_progress="hidden", show_progress_on=[chatbot],
                               concurrency_limit=None, **HIDDEN)
    after_reply(reply)
    replies.append(reply)
    replies.append(follow_btn.click(
        handlers.follow, [current, search], [chatbot, message, chat_list, cache_md, listed_writing,
                                    list_timer],
        show_progress="hidden", show_progress_on=[chatbot], concurrency_limit=None,
        trigger_mode="multiple", **HIDDEN))  # the same chat again: a new following
    # Stop ends the reply of the chat shown (not merely its following); its following then
    # ends, and end_send shows the reply as kept.
    waited_btn.click(handlers.waited, [waited], None, queue=False, show_progress="hidden",
                     **HIDDEN)
    message.stop(handlers.stop_reply, [current, pending], None, queue=False, **HIDDEN).then(
        None, None, None, js=FOCUS_MESSAGE_JS, **HIDDEN)
    list_timer.tick(handlers.check_list, [current, search, listed_writing],
                    [chat_list, listed_writing, list_timer], queue=False,
                    show_progress="hidden", **HIDDEN)
    demo.unload(handlers.tab_closed)
    # While the user types, the part of the prompt the message already fixes is evaluated
    # (never waiting for the model): sending then evaluates only the rest.
    message.change(handlers.type_ahead, [message, current, docs], None,
                   trigger_mode="always_last",
                   queue=False, show_progress="hidden", **HIDDEN)

    # Opening, making or changing a chat stops following the reply being written (it goes
    # on), follows the one of the chat now shown, if any, and typing goes on in the message
    # box.
    # The Chatbot's own Clear (its trash icon) deletes the chat shown, once the person says
    # yes (CLEAR_JS); it used to open a new chat, deleting nothing.
    for event in (
            # (no progress of Gradio's over the chat: a new chat needs no model and shows at
            # once, and on a busy machine its "queue: 1/1" flashed over the view)
            new_btn.click(handlers.on_new_chat, None, view, cancels=replies,
                          show_progress="hidden", **HIDDEN),
            chatbot.clear(handlers.act, [action, current], [*view, download, cache_md],
                          cancels=replies, js=CLEAR_JS, **HIDDEN),
            # Every click counts, answered in its order: Gradio's default ("once") dropped a
            # click that came while the one before was still being answered (‹ right after
            # opening a chat), and two run at once could answer in the other order (the
            # open's view, read before the ‹ was stored, shown after it). Actions are quick
            # (a few database reads or writes), so they take turns, everyone's, in one line
            # with the search's list (below).
            action_btn.click(handlers.act, [action, current], [*view, download, cache_md],
                             cancels=replies,
                             js="(action, chat) => [window.reameAction || '', chat]",
                             trigger_mode="multiple", **LIST_LINE, **HIDDEN)):
        event.then(None, [shown_id], None, js=SHOW_URL_JS, **HIDDEN)
        event.then(None, None, None, js=FOCUS_MESSAGE_JS, **HIDDEN).then(
            None, None, None, js=FOLLOW_JS, **HIDDEN)
    download.change(None, [download], None, js=DOWNLOAD_JS, **HIDDEN)
    for event in users.moved_chats if users is not None else ():  # chats adopted: list them
        event.then(handlers.find, [search, current], [chat_list], **HIDDEN)
    # change, not input: Gradio 6's Textbox sends no input event for a deletion, so clearing
    # the box left the list on its last search. In the actions' line: opening a search result
    # empties the box, and the list that change sends, marked with the chat open then, came
    # (unqueued) after the next chat opened with the keys and marked the old one again (seen
    # once in a fresh-clone run of test_page_chats).
    search.change(handlers.find, [search, current], [chat_list], trigger_mode="always_last",
                  show_progress="hidden", **LIST_LINE, **HIDDEN)
    export_all_btn.click(handlers.export_all, None, [download], **HIDDEN)
    import_btn.upload(handlers.import_chats, [import_btn, current], view, cancels=replies,
                      **HIDDEN).then(None, [shown_id], None, js=SHOW_URL_JS, **HIDDEN)
    for control in (system_prompt, max_tokens):
        control.blur(handlers.save_settings, [current, *chat_settings], None, js=panel_js(1),
                     **HIDDEN)
    for control in (temperature, top_p):
        control.release(handlers.save_settings, [current, *chat_settings], None, js=panel_js(1),
                        **HIDDEN)
