"""The page's "Custom instructions" panel: how the model should answer and what it should know
about you, for every chat you start (reame/chats/instructions.py). Each user sees and keeps
their own; the chats already started keep the system prompt they began with."""

from __future__ import annotations

import html

import gradio as gr

from reame.chats.instructions import MAX_CHARS
from reame.chats.service import ChatError, ChatService
from reame.web.http.user import user_of
from reame.web.page.parts import HIDDEN, panel

SAVED = ("Saved. The chats you start from now on follow them (their opening is read once and "
         "shared by your new chats); the chats already started keep theirs.")
CLEARED = "Cleared. New chats start with the server's default system prompt."


class InstructionsPanel:
    """Built into the page where build() is called; show() fills it when the page loads."""

    def __init__(self, service: ChatService):
        self.service = service

    def build(self) -> None:
        with panel("Custom instructions", "instructions"):
            self.how = gr.Textbox(
                label="How to answer", lines=2, max_lines=8, max_length=MAX_CHARS,
                placeholder="e.g. Short answers, metric units, say when you are unsure.",
                elem_id="how-to-answer")
            self.about = gr.Textbox(
                label="About me", lines=2, max_lines=8, max_length=MAX_CHARS,
                placeholder="e.g. I teach chemistry at a school in Lisbon.",
                elem_id="about-me")
            with gr.Row():
                save = gr.Button("Save for new chats", size="sm", scale=0, min_width=170,
                                 elem_id="save-instructions")
                self.note = gr.HTML(elem_id="instructions-note", padding=False)
        save.click(self.save, [self.how, self.about], [self.how, self.about, self.note],
                   **HIDDEN)

    @property
    def outputs(self) -> list[gr.components.Component]:
        return [self.how, self.about]

    def show(self, request: gr.Request) -> tuple[str, str]:
        mine = self.service.instructions(user_of(request))
        return mine.how_to_answer, mine.about_me

    def save(self, how: str, about: str, request: gr.Request):
        try:
            kept = self.service.set_instructions(how, about, user=user_of(request))
        except ChatError as exc:
            return gr.update(), gr.update(), (
                f'<p role="alert">{html.escape(str(exc))}</p>')
        said = SAVED if kept else CLEARED
        return kept.how_to_answer, kept.about_me, f'<p role="status">{said}</p>'
