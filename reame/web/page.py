"""The Gradio page: layout and thin handlers over ChatService. Handlers take state, return state."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import gradio as gr

from ..chat import (ChatError, ChatNotFound, ChatService, EmptyMessage, NoModel,
                    kept_on_regenerate)
from ..chat_settings import FIELD, ChatSettings
from ..render import inert_html, shown_reply, to_chatbot
from ..settings import Settings
from .page_parts import HIDDEN, ROLE_JS, flatten, panel, panel_js
from .page_settings import banner_texts, build_settings_tab, cache_markdown, loading_text
from .user import user_of

log = logging.getLogger(__name__)

STEP = 0.05  # of the sliders


def _range(name: str) -> tuple[float, float]:
    """A chat setting's range for a slider (an open end starts one step in)."""
    field = FIELD[name]
    return field.minimum + (STEP if field.low_open else 0), field.maximum


def _choices(service: ChatService, user: str | None) -> list[tuple[str, int]]:
    return [(chat.title, chat.id) for chat in service.list_chats(user)]


def _settings_values(service: ChatService, chat_id: int | None, user: str | None) -> tuple:
    """The chat settings panel's values: the chat's, or the defaults of a new one."""
    settings = (service.defaults if chat_id is None
                else ChatSettings.of(service.get_chat(chat_id, user)))
    return tuple(settings.as_dict().values())


def build_page(demo: gr.Blocks, service: ChatService, *, settings_group: str,
               settings: Settings | None = None, title: str = "Reame",
               can_configure: Callable[[str | None], bool] = lambda user: True) -> None:
    """The page, built into demo (the Blocks being defined). Settings changes run one at a time
    (the concurrency group settings_group); turns, any number at once (the service's scheduler
    lines them up). can_configure(user) says who may change the settings (with accounts:
    admins)."""
    current = gr.State(None)  # the chat shown, by id
    pending = gr.State("")  # the message being sent (the textbox clears at once)

    with gr.Sidebar(open=True, elem_id="sidebar"):
        gr.Markdown(f"### {title}")
        new_btn = gr.Button("+ New chat", variant="primary", elem_id="new-chat")
        chat_list = gr.Radio(choices=[], label="Chats", elem_id="chat-list")
        with panel("Rename or delete", "manage"):
            rename_box = gr.Textbox(label="New title", elem_id="rename-box", max_lines=1)
            rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
            delete_btn = gr.Button("Delete chat", variant="stop", elem_id="delete-btn",
                                   size="sm")
            with gr.Row(visible=False) as confirm_row:
                gr.Markdown("Delete this chat and all its messages?", elem_id="confirm-text")
                confirm_btn = gr.Button("Delete", variant="stop", elem_id="confirm-delete",
                                        size="sm")
                cancel_btn = gr.Button("Cancel", elem_id="cancel-delete", size="sm")
        with gr.Accordion("Cache", open=True, elem_id="cache-panel"):
            cache_md = gr.Markdown(elem_id="cache-stats")

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
        """The chat as the Chatbot shows it, marked where the model's window starts."""
        if messages is None:
            chat, messages = service.chat_and_messages(chat_id, user)
        else:
            chat = service.get_chat(chat_id, user)
        return to_chatbot(messages, chat.window_start)

    def show(chat_id, request: gr.Request):
        """Everything that depends on which chat is shown."""
        user = user_of(request)
        if chat_id is not None:
            try:
                messages = shown(chat_id, user)
            except ChatNotFound:
                chat_id, messages = None, []
            else:  # restore its KV while the user reads and types
                threading.Thread(target=service.warm, args=(chat_id, user),
                                 daemon=True).start()
        else:
            messages = []
        return (chat_id, gr.Radio(choices=_choices(service, user), value=chat_id), messages,
                *_settings_values(service, chat_id, user))

    def on_load(request: gr.Request):
        chats = service.list_chats(user_of(request))
        return show(chats[0].id if chats else None, request)

    def on_new_chat(request: gr.Request):
        try:
            chat = service.new_chat(user=user_of(request))
        except ChatError as exc:  # e.g. TooManyChats: the chat shown stays
            gr.Warning(str(exc))
            return tuple(gr.skip() for _ in view)
        return show(chat.id, request)

    def loading_model():
        """The model being loaded (from the Settings tab or the API), if any."""
        return settings.loading_model if settings is not None else None

    def check_send(text, _chat_id, _in_progress, _prompt, _temp, _top, _max_tok):
        """Runs before begin_send; a refusal shows on the textbox and changes nothing else."""
        try:
            service.check_message(text or "")
            problem = ""
        except EmptyMessage:
            problem = "Type a message first."
        except NoModel as exc:
            problem = f"The model could not be loaded. {exc}"
        return (gr.validate(not problem, problem),
                *(gr.validate(True, "") for _ in range(2 + len(chat_settings))))

    def begin_send(text, chat_id, in_progress, prompt, temp, top, max_tok,
                   request: gr.Request):
        if in_progress:
            # A toast: the streaming reply's updates would wipe a validation message.
            raise gr.Error("A reply is still being written: wait for it, or press stop.",
                           print_exception=False)
        user = user_of(request)
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
        history = shown(chat_id, user)
        history.append({"role": "user", "content": inert_html(text)})
        loading = loading_model()
        if loading is not None:
            # The reply waits for the model: say so where the reply will be.
            history.append({"role": "assistant", "content": loading_text(loading)})
        return (chat_id, text, history, gr.Textbox(value="", submit_btn=False, stop_btn=True),
                gr.Radio(choices=_choices(service, user), value=chat_id))

    def stream_reply(text, chat_id, request: gr.Request):
        if not text:
            return
        user = user_of(request)
        base = shown(chat_id, user)
        base.append({"role": "user", "content": inert_html(text)})
        try:
            for update in service.send(chat_id, text, user=user):
                reply = shown_reply(update)
                # Leave the textbox alone: the user may be typing the next message.
                yield base + [{"role": "assistant", "content": reply}], gr.skip()
        except ChatError as exc:  # e.g. MessageTooLong: nothing was stored
            # A toast rather than gr.Error: on an error the Chatbot keeps an "Error" badge
            # over the conversation. The text goes back so that the user loses nothing.
            gr.Warning(str(exc))
            yield shown(chat_id, user), text

    def type_ahead(text, chat_id, request: gr.Request):
        if chat_id is not None and text:
            try:
                service.type_ahead(chat_id, text, user_of(request))
            except (ChatError, ChatNotFound):  # deleted meanwhile: nothing to prepare
                pass

    def end_send(chat_id, request: gr.Request):
        """After a reply, however it ended: done, failed, stopped, or another chat chosen.

        Shows the chat as stored. A stopped reply is saved when Gradio closes the cancelled
        generator, which it does before it runs this `.then`; and the stream's last chunks,
        which can arrive after another chat was chosen, are replaced by that chat.
        """
        user = user_of(request)
        try:
            messages = shown(chat_id, user) if chat_id is not None else []
        except ChatNotFound:
            messages = []
        return (messages, gr.Textbox(submit_btn=True, stop_btn=False),
                gr.Radio(choices=_choices(service, user), value=chat_id), "",
                cache_markdown(service, user, whole_server=can_configure(user)))

    def stream_turn(base, start):
        """Stream a regenerated or edited reply after base (the messages kept)."""
        try:
            for update in start():
                reply = shown_reply(update)
                yield base + [{"role": "assistant", "content": reply}]
        except ChatError as exc:
            gr.Warning(str(exc))

    def regenerate(chat_id, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)
        kept = kept_on_regenerate(service.messages(chat_id, user))
        yield from stream_turn(shown(chat_id, user, kept),
                               lambda: service.regenerate(chat_id, user=user))

    def edit(chat_id, data: gr.EditData, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)
        messages = service.messages(chat_id, user)
        index = data.index if isinstance(data.index, int) else data.index[0]
        text = flatten(data.value)
        try:
            if not 0 <= index < len(messages):
                raise ChatError("This message is no longer in the chat.")
            # Refused (not the user's message, empty, ...) before anything changes.
            updates = service.edit_message(chat_id, messages[index].id, text, user=user)
        except ChatError as exc:
            gr.Warning(str(exc))
            yield shown(chat_id, user, messages)
            return
        base = shown(chat_id, user, messages[:index]) + [
            {"role": "user", "content": inert_html(text)}]
        yield from stream_turn(base, lambda: updates)

    def rename(chat_id, new_title, request: gr.Request):
        if chat_id is None:
            raise gr.Error("No chat is selected.")
        user = user_of(request)
        try:
            service.rename_chat(chat_id, new_title, user)
        except ChatError as exc:
            raise gr.Error(str(exc)) from None
        return gr.Radio(choices=_choices(service, user), value=chat_id), ""

    def ask_delete(chat_id):
        if chat_id is None:
            raise gr.Error("No chat is selected.")
        return gr.Row(visible=True)

    def delete(chat_id, request: gr.Request):
        user = user_of(request)
        if chat_id is not None:
            try:
                service.delete_chat(chat_id, user)
            except ChatNotFound:
                pass
        chats = service.list_chats(user)
        return (*show(chats[0].id if chats else None, request), gr.Row(visible=False))

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

    view = [current, chat_list, chatbot, *chat_settings]
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
        return (*on_load(request), cache_markdown(service, user, whole_server=admin),
                "admin" if admin else "user", *show_settings(request))

    demo.load(on_load_page, None, [*view, cache_md, role, *settings_outputs], queue=False,
              **HIDDEN).then(None, [role], None, js=ROLE_JS, **HIDDEN)

    # Progress and errors only on the textbox, hidden: the Chatbot would show an "Error"
    # badge over the conversation even with show_progress="hidden".
    sending = message.submit(
        begin_send, [message, current, pending, *chat_settings],
        [current, pending, chatbot, message, chat_list], validator=check_send,
        js=panel_js(3), show_progress="hidden", show_progress_on=[message], **HIDDEN,
    )
    # Progress (the "..." bubble) on the chatbot only, not over the textbox.
    streaming = sending.success(
        stream_reply, [pending, current], [chatbot, message], show_progress="minimal",
        show_progress_on=[chatbot], concurrency_limit=None, **HIDDEN,  # the scheduler's line
    )
    # Runs after the reply ends, also when cancelled (stop, chat switch, delete).
    after = [chatbot, message, chat_list, pending, cache_md]
    streaming.then(end_send, [current], after, queue=False, **HIDDEN)
    # Regenerate (the retry button under the last reply) and edit (a user message).
    for trigger, fn, inputs in ((chatbot.retry, regenerate, [current]),
                                (chatbot.edit, edit, [current])):
        trigger(fn, inputs, [chatbot], show_progress="minimal", show_progress_on=[chatbot],
                concurrency_limit=None, **HIDDEN).then(
            end_send, [current], after, queue=False, **HIDDEN)
    message.stop(None, None, None, cancels=[streaming], **HIDDEN)
    # While the user types, the part of the prompt the message already fixes is evaluated
    # (never waiting for the model): sending then evaluates only the rest.
    message.change(type_ahead, [message, current], None, trigger_mode="always_last",
                   queue=False, show_progress="hidden", **HIDDEN)

    # Switching chats stops a reply in progress (its partial text is saved).
    new_btn.click(on_new_chat, None, view, cancels=[streaming], **HIDDEN)
    chat_list.input(show, [chat_list], view, cancels=[streaming], **HIDDEN)
    for trigger in (rename_btn.click, rename_box.submit):
        trigger(rename, [current, rename_box], [chat_list, rename_box],
                show_progress="hidden", **HIDDEN)
    delete_btn.click(ask_delete, [current], [confirm_row], **HIDDEN)
    cancel_btn.click(lambda: gr.Row(visible=False), None, [confirm_row], queue=False,
                     **HIDDEN)
    confirm_btn.click(delete, [current], [*view, confirm_row], cancels=[streaming], **HIDDEN)
    for control in (system_prompt, max_tokens):
        control.blur(save_settings, [current, *chat_settings], None, js=panel_js(1),
                     **HIDDEN)
    for control in (temperature, top_p):
        control.release(save_settings, [current, *chat_settings], None, js=panel_js(1),
                        **HIDDEN)
