"""The Gradio page: layout and thin handlers over ChatService. Handlers take state, return state."""

from __future__ import annotations

import html
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import aclosing

import anyio.to_thread
import gradio as gr

from reame.admin.live_settings import Settings
from reame.chats.service import ChatService
from reame.chats.turns import kept_on_regenerate
from reame.config.chat_settings import FIELD, ChatSettings
from reame.config.refusals import ChatError, ChatNotFound, EmptyMessage, NoModel
from reame.web.chat_list import SHOWN, chat_list_html, search_results_html
from reame.web.live_replies import LiveReplies, LiveReply
from reame.web.page_parts import (
    DOWNLOAD_JS,
    FOCUS_MESSAGE_JS,
    FOLLOW_JS,
    HIDDEN,
    ROLE_JS,
    flatten,
    import_button,
    panel,
    panel_js,
)
from reame.web.render import inert_html, shown_reply, to_chatbot
from reame.web.settings_tab import banner_texts, build_settings_tab, cache_markdown, loading_text
from reame.web.uploads import UploadRefused, Uploads, session_key
from reame.web.user import user_of

log = logging.getLogger(__name__)

STEP = 0.05  # of the sliders


async def in_thread(fn, *args):
    """fn(*args) in a worker thread: an async handler's database reads leave the event loop
    free."""
    return await anyio.to_thread.run_sync(fn, *args)


def _range(name: str) -> tuple[float, float]:
    """A chat setting's range for a slider (an open end starts one step in)."""
    field = FIELD[name]
    return field.minimum + (STEP if field.low_open else 0), field.maximum


def _listing(service: ChatService, user: str | None, chat_id: int | None,
             words: str = "", writing: frozenset[int] = frozenset()) -> str:
    """The chat list's HTML: the user's chats, or those a search for words found; writing:
    the chats whose reply is being written."""
    if words.strip():
        return search_results_html(service.search(words, user), chat_id, words,
                                   writing=writing)
    return chat_list_html(service.list_chats(user, limit=SHOWN), chat_id,
                          total=service.count_chats(user), writing=writing)


def _latest(service: ChatService, user: str | None) -> int | None:
    chat = service.latest_chat(user)
    return chat.id if chat is not None else None


def _download(file: dict) -> str:
    """A file for DOWNLOAD_JS to save: the same export twice is still a change (its time)."""
    return json.dumps({**file, "at": time.time()})


def _settings_values(service: ChatService, chat_id: int | None, user: str | None) -> tuple:
    """The chat settings panel's values: the chat's, or the defaults of a new one."""
    settings = (service.defaults if chat_id is None
                else ChatSettings.of(service.get_chat(chat_id, user)))
    return tuple(settings.as_dict().values())


def build_page(demo: gr.Blocks, service: ChatService, *, settings_group: str,
               settings: Settings | None = None, title: str = "Reame",
               can_configure: Callable[[str | None], bool] = lambda user: True,
               name_of: Callable[[str | None], str | None] = lambda user: None,
               uploads: Uploads | None = None, unwatched_s: float = 10) -> None:
    """The page, built into demo (the Blocks being defined). Settings changes run one at a time
    (the concurrency group settings_group); turns, any number at once (the service's scheduler
    lines them up). can_configure(user) says who may change the settings (with accounts:
    admins); name_of(user) is the name a logged-in user goes by (None: no accounts).
    Replies go on being written when the page shows another chat (live_replies); one that no
    open tab watches is stopped after unwatched_s."""
    live = LiveReplies(unwatched_s)
    current = gr.State(None)  # the chat shown, by id
    pending = gr.State("")  # the message being sent (the textbox clears at once)
    # The chats of the user whose reply is being written, as the list last showed them.
    listed_writing = gr.State(frozenset())

    with gr.Sidebar(open=True, elem_id="sidebar"):
        gr.Markdown(f"### {title}")
        new_btn = gr.Button("+ New chat", variant="primary", elem_id="new-chat")
        search = gr.Textbox(label="Search chats", show_label=False, container=False,
                            placeholder="Search chats (Ctrl+K)", max_lines=1,
                            elem_id="chat-search")
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
    follow_btn = gr.Button("Follow the reply", elem_id="reame-follow-btn",
                           elem_classes=["reame-offscreen"])
    # While replies are written in chats not shown, the list is checked for their end.
    list_timer = gr.Timer(2.0, active=False)
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
        settings_view = None
        if settings is not None:
            with gr.Tab("Settings", id="settings", elem_id="settings-tab"):
                settings_view = build_settings_tab(settings, settings_group=settings_group,
                                                   banner=banner,
                                                   can_configure=can_configure)

    # handlers

    # Every handler that touches a chat passes on the logged-in user (gr.Request): the
    # service answers for another user's chat as if it did not exist.

    def shown(chat_id, user, messages=None):
        """The chat as the Chatbot shows it, marked where the model's window starts; the
        whole branch shown with its tools (versions, branch), or only messages, without."""
        if messages is None:
            chat, thread = service.thread(chat_id, user)
            return to_chatbot(thread.branch, chat.window_start, thread)
        return to_chatbot(messages, service.get_chat(chat_id, user).window_start)

    def writing(user):
        return frozenset(live.chats_of(user))

    def listing(user, chat_id, words=""):
        return _listing(service, user, chat_id, words, writing(user))

    def show(chat_id, request: gr.Request):
        """Everything that depends on which chat is shown; a reply being written in it is
        shown as far as it got (FOLLOW_JS then follows it)."""
        user = user_of(request)
        reply = live.get(user, chat_id)
        if reply is not None:
            messages = live_view(reply)
        elif chat_id is not None:
            try:
                messages = shown(chat_id, user)
            except ChatNotFound:
                chat_id, messages = None, []
            else:  # restore its KV while the user reads and types
                threading.Thread(target=service.warm, args=(chat_id, user),
                                 daemon=True).start()
        else:
            messages = []
        live.showing(request.session_hash, chat_id)  # a following of another chat ends
        return (chat_id, listing(user, chat_id), messages,
                *_settings_values(service, chat_id, user), "")

    def on_load(request: gr.Request):
        return show(_latest(service, user_of(request)), request)

    def on_new_chat(request: gr.Request):
        try:
            chat = service.empty_chat(user=user_of(request))
        except ChatError as exc:  # e.g. TooManyChats: the chat shown stays
            gr.Warning(str(exc))
            return tuple(gr.skip() for _ in view)
        return show(chat.id, request)

    def loading_model():
        """The model being loaded (from the Settings tab or the API), if any."""
        return settings.loading_model if settings is not None else None

    def check_send(text, _chat_id, _in_progress, _words, _prompt, _temp, _top, _max_tok):
        """Runs before begin_send; a refusal shows on the textbox and changes nothing else."""
        try:
            service.check_message(text or "")
            problem = ""
        except EmptyMessage:
            problem = "Type a message first."
        except NoModel as exc:
            problem = f"The model could not be loaded. {exc}"
        return (gr.validate(not problem, problem),
                *(gr.validate(True, "") for _ in range(3 + len(chat_settings))))

    def begin_send(text, chat_id, in_progress, words, prompt, temp, top, max_tok,
                   request: gr.Request):
        user = user_of(request)
        if in_progress or live.get(user, chat_id) is not None:
            # A toast: the streaming reply's updates would wipe a validation message.
            raise gr.Error("A reply is still being written: wait for it, or press stop.",
                           print_exception=False)
        if chat_id is None:
            try:
                chat_id = service.new_chat(user=user).id
            except ChatError as exc:  # the text stays in the box
                raise gr.Error(str(exc), print_exception=False) from None
        # The chat's settings as the panel shows them: a value typed just before sending
        # counts even if its own save (on blur) has not arrived yet.
        values = (prompt, temp, top, max_tok)
        if values != tuple(_settings_values(service, chat_id, user)):
            save_settings(chat_id, *values, request)
        live.showing(request.session_hash, chat_id)
        history = shown(chat_id, user)
        history.append({"role": "user", "content": inert_html(text)})
        loading = loading_model()
        if loading is not None:
            # The reply waits for the model: say so where the reply will be.
            history.append({"role": "assistant", "content": loading_text(loading)})
        return (chat_id, text, history, gr.Textbox(value="", submit_btn=False, stop_btn=True),
                listing(user, chat_id, words))

    def live_view(reply: LiveReply) -> list[dict]:
        """A reply being written as the Chatbot shows it: under the chat as it was when it
        started, the reply so far (or its place in line)."""
        if reply.latest is None:
            return reply.base
        return reply.base + [{"role": "assistant", "content": shown_reply(reply.latest)}]

    async def follow_reply(user, chat_id, tab):
        """The Chatbot (and, once, the message box with its Stop) while the chat's reply is
        written; nothing if none is. Cancelling this (another chat chosen, the tab closed)
        stops the following, not the reply."""
        first = True
        async with aclosing(live.follow(user, chat_id, tab)) as updates:
            async for reply in updates:
                # Before its first update the page shows the reply's chat already (begin_send,
                # with a model load's notice; or show()). Leave the textbox's text alone: the
                # user may be typing the next message.
                view = live_view(reply) if reply.latest is not None else gr.skip()
                yield view, (gr.Textbox(submit_btn=False, stop_btn=True) if first
                             else gr.skip())
                first = False

    async def write_reply(user, chat_id, request, base, begin, text=None):
        """Start a reply in the background and follow it. A refusal (e.g. MessageTooLong:
        nothing was stored) is a toast rather than gr.Error — on an error the Chatbot keeps an
        "Error" badge over the conversation — and a sent text goes back to the box, so that
        the user loses nothing; so does a Stop that came before the reply started."""
        try:
            started = live.start(user, chat_id, request.session_hash, base, begin)
            if started is None:
                yield await in_thread(shown, chat_id, user), text if text else gr.skip()
                return
            async with aclosing(follow_reply(user, chat_id, request.session_hash)) as updates:
                async for update in updates:
                    yield update
        except (ChatError, ChatNotFound) as exc:
            gr.Warning(str(exc))
            yield await in_thread(shown, chat_id, user), text if text else gr.skip()

    async def stream_reply(text, chat_id, request: gr.Request):
        if not text:
            return
        user = user_of(request)
        base = await in_thread(shown, chat_id, user)
        base.append({"role": "user", "content": inert_html(text)})
        async with aclosing(write_reply(user, chat_id, request, base, lambda: service.send(
                chat_id, text, user=user), text)) as updates:
            async for update in updates:
                yield update

    async def follow(chat_id, words, request: gr.Request):
        """Once a chat is shown: follow the reply being written in it, if any, then show the
        chat as kept (as end_send does for the tab that sent it, but without end_send's reset
        of the message being sent: run late, after nothing to follow, it would lose a message
        sent meanwhile). And the list's timer on while replies are written in other chats."""
        user = user_of(request)
        extra = (gr.skip(),) * 4
        followed = False
        async with aclosing(follow_reply(user, chat_id, request.session_hash)) as updates:
            async for update in updates:
                followed = True
                yield *update, *extra
        now = writing(user)
        timer = gr.Timer(active=bool(now - {chat_id}))
        if chat_id in now:  # a new reply began meanwhile: its own following shows it
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), now, timer
            return
        # Send back. The chat itself only after a following: show() drew it as kept just
        # before, and drawing it again here, late on a busy machine, undid what the user did
        # meanwhile (a version chosen with ‹). No chunk of the chat left comes after show():
        # its following ends once the tab shows another chat (LiveReplies.showing).
        ready = gr.Textbox(submit_btn=True, stop_btn=False)
        if not followed:
            yield gr.skip(), ready, gr.skip(), gr.skip(), now, timer
            return
        try:
            messages = await in_thread(shown, chat_id, user) if chat_id is not None else []
        except ChatNotFound:
            messages = gr.skip()
        yield (messages, ready, await in_thread(listing, user, chat_id, words),
               await in_thread(lambda: cache_markdown(
                   service, user, whole_server=can_configure(user))), now, timer)

    def stop_reply(chat_id, in_progress, request: gr.Request):
        """Stop: the reply of the chat shown ends at its next step and is kept."""
        live.stop(user_of(request), chat_id, starting=bool(in_progress))

    async def tab_closed(request: gr.Request):
        live.leave(request.session_hash)

    def check_list(chat_id, words, shown_writing, request: gr.Request):
        """While replies are written in other chats: the list again once one has ended
        (its "writing" mark gone), and the timer off once none is left."""
        user = user_of(request)
        now = writing(user)
        listed = listing(user, chat_id, words) if now != shown_writing else gr.skip()
        return listed, now, gr.Timer(active=bool(now - {chat_id}))

    def type_ahead(text, chat_id, request: gr.Request):
        if chat_id is not None and text:
            try:
                service.type_ahead(chat_id, text, user_of(request))
            except (ChatError, ChatNotFound):  # deleted meanwhile: nothing to prepare
                pass

    def end_send(chat_id, words, request: gr.Request):
        """After following a reply, however it ended: done, failed, stopped, or another chat
        chosen (the reply goes on). Shows the chat as stored — the stream's last chunks, which
        can arrive after another chat was chosen, are replaced by that chat — unless a reply
        is being written in the chat shown: its own following shows it. While replies are
        written in other chats, the list's timer watches for their end."""
        user = user_of(request)
        now = writing(user)
        timer = gr.Timer(active=bool(now - {chat_id}))
        cache = cache_markdown(service, user, whole_server=can_configure(user))
        if chat_id in now:
            return (gr.skip(), gr.skip(), listing(user, chat_id, words), gr.skip(), cache,
                    now, timer)
        try:
            messages = shown(chat_id, user) if chat_id is not None else []
        except ChatNotFound:
            messages = []
        return (messages, gr.Textbox(submit_btn=True, stop_btn=False),
                listing(user, chat_id, words), "", cache, now, timer)

    async def regenerate(chat_id, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)

        def prepare():
            return shown(chat_id, user, kept_on_regenerate(service.messages(chat_id, user)))

        async with aclosing(write_reply(user, chat_id, request, await in_thread(prepare),
                                        lambda: service.regenerate(chat_id, user=user))) as ups:
            async for update in ups:
                yield update

    async def edit(chat_id, data: gr.EditData, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)
        index = data.index if isinstance(data.index, int) else data.index[0]
        text = flatten(data.value)

        def prepare():
            """The messages kept before the edited one; the turn, refused (not the user's
            message, empty, ...) before anything changes."""
            messages = service.messages(chat_id, user)
            if not 0 <= index < len(messages):
                raise ChatError("This message is no longer in the chat.")
            updates = service.edit_message(chat_id, messages[index].id, text, user=user)
            return shown(chat_id, user, messages[:index]), updates

        try:
            kept, updates = await in_thread(prepare)
        except ChatError as exc:
            gr.Warning(str(exc))
            yield await in_thread(shown, chat_id, user), gr.skip()
            return
        base = kept + [{"role": "user", "content": inert_html(text)}]
        async with aclosing(write_reply(user, chat_id, request, base,
                                        lambda: updates)) as stream:
            async for update in stream:
                yield update

    def act(action, chat_id, request: gr.Request):
        """A button of the chat list or inside a message (chat_list.py, render.message_tools):
        "KIND:ID[:TEXT]". open, pin, rename, delete, export and markdown name a chat; show
        (a version) and branch (from here) a message of the chat shown. The view, and an
        export's file for the browser to save ("" for none), and the Cache panel."""
        kind, _, rest = (action or "").partition(":")
        target, _, text = rest.partition(":")
        skip = tuple(gr.skip() for _ in view) + ("", gr.skip())
        if not target.isdigit():
            return skip
        target, user = int(target), user_of(request)
        try:
            if kind == "open":
                chat_id = target
            elif kind == "pin":
                service.toggle_pin(target, user)
            elif kind == "rename":
                service.rename_chat(target, text, user)
            elif kind == "delete":
                live.stop(user, target)  # its reply first: nothing is written into it after
                service.delete_chat(target, user)
                if target == chat_id:
                    chat_id = _latest(service, user)
            elif kind in ("export", "markdown"):
                return skip[:-2] + (_download(service.export_file(
                    target, user, markdown=kind == "markdown")), gr.skip())
            elif kind == "show" and chat_id is not None:
                service.show_version(chat_id, target, user)
            elif kind == "branch" and chat_id is not None:
                chat_id = service.branch(chat_id, target, user).id
            else:
                return skip
        except (ChatError, ChatNotFound) as exc:
            gr.Warning(str(exc))
            return skip
        return (*show(chat_id, request), "",
                cache_markdown(service, user, whole_server=can_configure(user)))

    def find(words, chat_id, request: gr.Request):
        """The chat list as the search box asks: the chats found, or all of them."""
        user = user_of(request)
        return listing(user, chat_id, words)

    def export_all(request: gr.Request):
        return _download(service.export_file(None, user_of(request)))

    def import_chats(upload, chat_id, request: gr.Request):
        """Chats from a file: Reame's export or ChatGPT's conversations.json."""
        user = user_of(request)
        if uploads is None:
            raise gr.Error("Nothing was imported: this server takes no uploads",
                           print_exception=False)
        try:
            data = uploads.take(upload, session_key(request.headers.get("cookie", "")))
            made = service.import_chats(data, user)
        except (ChatError, UploadRefused) as exc:
            raise gr.Error(f"Nothing was imported: {exc}", print_exception=False) from None
        gr.Info(f"Imported {len(made):,} chat{'s' if len(made) != 1 else ''}.")
        return show(made[0].id if made else chat_id, request)

    def save_settings(chat_id, prompt, temp, top, max_tok, request: gr.Request):
        if chat_id is None:
            return
        try:
            service.update_settings(chat_id, system_prompt=prompt, temperature=temp,
                                    top_p=top, max_tokens=int(max_tok) if max_tok else None,
                                    user=user_of(request))
        except ChatError as exc:
            raise gr.Error(str(exc)) from None

    # wiring

    view = [current, chat_list, chatbot, *chat_settings, search]
    # One load event for the whole page, not queued: a quick read that fills it at once
    # (tests/browser_helpers.py waits for its one /run/predict answer as "page ready").
    show_settings, settings_outputs = settings_view or (lambda request: (), [])
    # "admin" or "user", for the page: a user who may not change the settings does not
    # see the Settings tab (its fields stay empty for them anyway). Not gr.Tab(visible=):
    # an inactive tab is rendered only when opened, so an update to it is not applied.
    role = gr.Textbox(visible=False, elem_id="reame-role")

    def on_load_page(request: gr.Request):
        user = user_of(request)
        admin = can_configure(user)
        name = name_of(user)
        signed_in = ("" if name is None else
                     f'Signed in as <strong>{html.escape(name)}</strong> · '
                     '<a href="logout" class="reame-logout">Log out</a>')
        return (*on_load(request), cache_markdown(service, user, whole_server=admin),
                "admin" if admin else "user", signed_in, *show_settings(request))

    demo.load(on_load_page, None, [*view, cache_md, role, account, *settings_outputs],
              queue=False,
              **HIDDEN).then(None, [role], None, js=ROLE_JS, **HIDDEN).then(
                  None, None, None, js=FOLLOW_JS, **HIDDEN)

    # Progress and errors only on the textbox, hidden: the Chatbot would show an "Error"
    # badge over the conversation even with show_progress="hidden".
    sending = message.submit(
        begin_send, [message, current, pending, search, *chat_settings],
        [current, pending, chatbot, message, chat_list], validator=check_send,
        js=panel_js(4), show_progress="hidden", show_progress_on=[message], **HIDDEN,
    )
    # Progress (the "..." bubble) on the chatbot only, not over the textbox.
    streaming = sending.success(
        stream_reply, [pending, current], [chatbot, message], show_progress="minimal",
        show_progress_on=[chatbot], concurrency_limit=None, **HIDDEN,  # the scheduler's line
    )
    # Runs after the following of a reply ends, also when cancelled (chat switch, delete).
    after = [chatbot, message, chat_list, pending, cache_md, listed_writing, list_timer]
    streaming.then(end_send, [current, search], after, queue=False, **HIDDEN)
    # Regenerate (the retry button under the last reply) and edit (a user message), and the
    # following of a reply written in a chat just shown: the message box's Stop stops them too.
    replies = [streaming]
    for trigger, fn in ((chatbot.retry, regenerate), (chatbot.edit, edit)):
        reply = trigger(fn, [current], [chatbot, message], show_progress="minimal",
                        show_progress_on=[chatbot], concurrency_limit=None, **HIDDEN)
        reply.then(end_send, [current, search], after, queue=False, **HIDDEN)
        replies.append(reply)
    replies.append(follow_btn.click(
        follow, [current, search], [chatbot, message, chat_list, cache_md, listed_writing,
                                    list_timer],
        show_progress="minimal", show_progress_on=[chatbot], concurrency_limit=None,
        trigger_mode="multiple", **HIDDEN))  # the same chat again: a new following
    # Stop ends the reply of the chat shown (not merely its following); its following then
    # ends, and end_send shows the reply as kept.
    message.stop(stop_reply, [current, pending], None, queue=False, **HIDDEN).then(
        None, None, None, js=FOCUS_MESSAGE_JS, **HIDDEN)
    list_timer.tick(check_list, [current, search, listed_writing],
                    [chat_list, listed_writing, list_timer], queue=False,
                    show_progress="hidden", **HIDDEN)
    demo.unload(tab_closed)
    # While the user types, the part of the prompt the message already fixes is evaluated
    # (never waiting for the model): sending then evaluates only the rest.
    message.change(type_ahead, [message, current], None, trigger_mode="always_last",
                   queue=False, show_progress="hidden", **HIDDEN)

    # Opening, making or changing a chat stops following the reply being written (it goes
    # on), follows the one of the chat now shown, if any, and typing goes on in the message
    # box.
    # The Chatbot's own Clear (its trash icon) empties the view: it opens an empty chat, the
    # one cleared stays in the list (else its messages would come back at the next load).
    for event in (
            new_btn.click(on_new_chat, None, view, cancels=replies, **HIDDEN),
            chatbot.clear(on_new_chat, None, view, cancels=replies, **HIDDEN),
            action_btn.click(act, [action, current], [*view, download, cache_md],
                             cancels=replies,
                             js="(action, chat) => [window.reameAction || '', chat]",
                             **HIDDEN)):
        event.then(None, None, None, js=FOCUS_MESSAGE_JS, **HIDDEN).then(
            None, None, None, js=FOLLOW_JS, **HIDDEN)
    download.change(None, [download], None, js=DOWNLOAD_JS, **HIDDEN)
    search.input(find, [search, current], [chat_list], trigger_mode="always_last", queue=False,
                 show_progress="hidden", **HIDDEN)
    export_all_btn.click(export_all, None, [download], **HIDDEN)
    import_btn.upload(import_chats, [import_btn, current], view, cancels=replies, **HIDDEN)
    for control in (system_prompt, max_tokens):
        control.blur(save_settings, [current, *chat_settings], None, js=panel_js(1),
                     **HIDDEN)
    for control in (temperature, top_p):
        control.release(save_settings, [current, *chat_settings], None, js=panel_js(1),
                        **HIDDEN)
