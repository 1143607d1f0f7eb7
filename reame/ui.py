"""The Gradio page: layout and thin handlers over ChatService. Handlers take state, return state."""

from __future__ import annotations

import logging

import gradio as gr

from .api import register_api
from .chat import ChatError, ChatNotFound, ChatService, MessageTooLong
from .render import inert_html, stats_line, to_chatbot

log = logging.getLogger(__name__)

GENERATE = "generate"  # one concurrency group for every event that runs the model

CSS = """
.reame-stats { font-size: 0.75em; opacity: 0.65; margin-top: 0.4em; }
#model-error { border: 1px solid var(--error-border-color, #f87171); border-radius: 8px;
               padding: 0.5em 1em; background: var(--error-background-fill, #fef2f2); }
"""

HIDDEN = dict(api_visibility="private")


def _choices(service: ChatService) -> list[tuple[str, int]]:
    return [(chat.title, chat.id) for chat in service.list_chats()]


def _settings_values(service: ChatService, chat_id: int | None) -> tuple:
    if chat_id is None:
        d = service.defaults
        return d.system_prompt, d.temperature, d.top_p, d.max_tokens
    chat = service.get_chat(chat_id)
    return chat.system_prompt, chat.temperature, chat.top_p, chat.max_tokens


def build_ui(service: ChatService, *, title: str = "Reame") -> gr.Blocks:
    with gr.Blocks(title=title, analytics_enabled=False, fill_height=True) as demo:
        # First, so that the API names stay exactly as documented.
        register_api(service, concurrency_id=GENERATE)
        current = gr.State(None)  # the chat shown, by id
        pending = gr.State("")  # the message being sent (the textbox clears at once)

        with gr.Sidebar(open=True, elem_id="sidebar"):
            gr.Markdown(f"### {title}")
            new_btn = gr.Button("＋ New chat", variant="primary", elem_id="new-chat")
            chat_list = gr.Radio(choices=[], label="Chats", elem_id="chat-list")
            with gr.Accordion("Rename or delete", open=False, elem_id="manage"):
                rename_box = gr.Textbox(label="New title", elem_id="rename-box", max_lines=1)
                rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
                delete_btn = gr.Button("Delete chat", variant="stop", elem_id="delete-btn",
                                       size="sm")
                with gr.Row(visible=False) as confirm_row:
                    gr.Markdown("Delete this chat and all its messages?", elem_id="confirm-text")
                    confirm_btn = gr.Button("Delete", variant="stop", elem_id="confirm-delete",
                                            size="sm")
                    cancel_btn = gr.Button("Cancel", elem_id="cancel-delete", size="sm")

        if service.load_error:
            gr.Markdown(f"**The model could not be loaded.** {inert_html(service.load_error)}",
                        elem_id="model-error")
        else:
            engine = service.engine
            gr.Markdown(f"Model: `{engine.name}` · context {engine.n_ctx:,} tokens",
                        elem_id="model-info")
        chatbot = gr.Chatbot(elem_id="chatbot", label="Chat", height="65vh", show_label=False,
                             sanitize_html=True, render_markdown=True, buttons=["copy"],
                             feedback_options=None, placeholder="Start a conversation.")
        message = gr.Textbox(placeholder="Message (Enter to send, Shift+Enter for a new line)",
                             show_label=False, lines=1, max_lines=8, submit_btn=True,
                             stop_btn=False, elem_id="message", autofocus=True)
        with gr.Accordion("Chat settings", open=False, elem_id="chat-settings"):
            system_prompt = gr.Textbox(label="System prompt", lines=2, elem_id="system-prompt")
            with gr.Row():
                temperature = gr.Slider(0, 2, step=0.05, label="Temperature",
                                        elem_id="temperature")
                top_p = gr.Slider(0.05, 1, step=0.05, label="Top p", elem_id="top-p")
                max_tokens = gr.Number(label="Max tokens", precision=0, minimum=1,
                                       maximum=32768, elem_id="max-tokens")
        settings = [system_prompt, temperature, top_p, max_tokens]

        # handlers

        def show(chat_id):
            """Everything that depends on which chat is shown."""
            if chat_id is not None:
                try:
                    messages = to_chatbot(service.messages(chat_id))
                except ChatNotFound:
                    chat_id, messages = None, []
            else:
                messages = []
            return (chat_id, gr.Radio(choices=_choices(service), value=chat_id), messages,
                    *_settings_values(service, chat_id))

        def on_load():
            chats = service.list_chats()
            return show(chats[0].id if chats else None)

        def on_new_chat():
            return show(service.new_chat().id)

        def begin_send(text, chat_id):
            if not text or not text.strip():
                raise gr.Error("Type a message first.")
            if service.engine is None:
                raise gr.Error(service.load_error)
            if chat_id is None:
                chat_id = service.new_chat().id
            history = to_chatbot(service.messages(chat_id))
            history.append({"role": "user", "content": inert_html(text)})
            return (chat_id, text, history, gr.Textbox(value="", submit_btn=False, stop_btn=True),
                    gr.Radio(choices=_choices(service), value=chat_id))

        def stream_reply(text, chat_id):
            if not text:
                return
            base = to_chatbot(service.messages(chat_id))
            base.append({"role": "user", "content": inert_html(text)})
            try:
                for update in service.send(chat_id, text):
                    reply = inert_html(update.text)
                    if update.done:
                        reply += stats_line(update.stats)
                    yield base + [{"role": "assistant", "content": reply}], ""
            except MessageTooLong as exc:
                # Nothing was stored: give the text back so the user loses nothing.
                yield to_chatbot(service.messages(chat_id)), text
                raise gr.Error(str(exc)) from None
            except ChatError as exc:
                yield to_chatbot(service.messages(chat_id)), text
                raise gr.Error(str(exc)) from None

        def end_send(chat_id):
            return (gr.Textbox(submit_btn=True, stop_btn=False),
                    gr.Radio(choices=_choices(service), value=chat_id), "")

        def after_stop(chat_id):
            # The stopped turn saved its partial reply: show what is stored.
            messages = to_chatbot(service.messages(chat_id)) if chat_id is not None else []
            return (messages, gr.Textbox(submit_btn=True, stop_btn=False),
                    gr.Radio(choices=_choices(service), value=chat_id), "")

        def rename(chat_id, new_title):
            if chat_id is None:
                raise gr.Error("No chat is selected.")
            try:
                service.rename_chat(chat_id, new_title)
            except ChatError as exc:
                raise gr.Error(str(exc)) from None
            return gr.Radio(choices=_choices(service), value=chat_id), ""

        def ask_delete(chat_id):
            if chat_id is None:
                raise gr.Error("No chat is selected.")
            return gr.Row(visible=True)

        def delete(chat_id):
            if chat_id is not None:
                try:
                    service.delete_chat(chat_id)
                except ChatNotFound:
                    pass
            chats = service.list_chats()
            return (*show(chats[0].id if chats else None), gr.Row(visible=False))

        def save_settings(chat_id, prompt, temp, top, max_tok):
            if chat_id is None:
                return
            try:
                service.update_settings(chat_id, system_prompt=prompt, temperature=temp,
                                        top_p=top, max_tokens=int(max_tok) if max_tok else None)
            except ChatError as exc:
                raise gr.Error(str(exc)) from None

        # wiring

        view = [current, chat_list, chatbot, *settings]
        demo.load(on_load, None, view, **HIDDEN)
        new_btn.click(on_new_chat, None, view, **HIDDEN)

        sending = message.submit(
            begin_send, [message, current], [current, pending, chatbot, message, chat_list],
            queue=False, **HIDDEN,
        )
        streaming = sending.success(
            stream_reply, [pending, current], [chatbot, message],
            concurrency_id=GENERATE, concurrency_limit=1, **HIDDEN,
        )
        streaming.then(end_send, [current], [message, chat_list, pending], queue=False, **HIDDEN)
        message.stop(None, None, None, cancels=[streaming], **HIDDEN).then(
            after_stop, [current], [chatbot, message, chat_list, pending], **HIDDEN)

        # Switching chats stops a reply in progress (its partial text is saved).
        chat_list.input(show, [chat_list], view, cancels=[streaming], **HIDDEN)
        rename_btn.click(rename, [current, rename_box], [chat_list, rename_box], **HIDDEN)
        rename_box.submit(rename, [current, rename_box], [chat_list, rename_box], **HIDDEN)
        delete_btn.click(ask_delete, [current], [confirm_row], queue=False, **HIDDEN)
        cancel_btn.click(lambda: gr.Row(visible=False), None, [confirm_row], queue=False,
                         **HIDDEN)
        confirm_btn.click(delete, [current], [*view, confirm_row], cancels=[streaming], **HIDDEN)
        for control in (system_prompt, max_tokens):
            control.blur(save_settings, [current, *settings], None, **HIDDEN)
        for control in (temperature, top_p):
            control.release(save_settings, [current, *settings], None, **HIDDEN)

    return demo
