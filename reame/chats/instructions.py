"""Custom instructions: what a user tells the model once for all the chats they start — how to
answer, and what to know about them — as ChatGPT and Open WebUI let a person do.

A new chat takes them into its system prompt, after the server's default one (system_prompt),
and keeps that text: changing the instructions later changes the chats started afterwards, not
the ones under way (their history, and its KV on disk, stay valid). A chat's own system prompt
(its settings) can still be edited like any other.

Their KV is computed once: the first chat's turn saves the opening (the system prompt with the
instructions, in whole chunks) as a snapshot in the user's scope, and every later new chat of
that user starts from it, or from an earlier chat's file, evaluating only its own message
(reame/inference/cache.py). The scope is the user's: another user with the same words starts
from their own KV, never from this one (reame/inference/scope.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from reame.chats.jsontext import is_text
from reame.config.refusals import ChatError

MAX_CHARS = 1500  # each of the two texts, as ChatGPT's fields

ABOUT_HEADING = "About the person you are talking with:"
HOW_HEADING = "How they would like you to answer:"


@dataclass(frozen=True)
class Instructions:
    how_to_answer: str = ""
    about_me: str = ""

    def __bool__(self) -> bool:
        return bool(self.how_to_answer or self.about_me)

    def system_prompt(self, base: str) -> str:
        """base (the server's default system prompt) with these instructions after it."""
        parts = [base.strip()] if base.strip() else []
        if self.about_me:
            parts.append(f"{ABOUT_HEADING}\n{self.about_me}")
        if self.how_to_answer:
            parts.append(f"{HOW_HEADING}\n{self.how_to_answer}")
        return "\n\n".join(parts)


def checked(how_to_answer: str | None, about_me: str | None) -> Instructions:
    """The instructions as they are kept (ends of lines and outer spaces trimmed); ChatError
    naming the field that is too long."""
    texts = []
    for name, text in (("How to answer", how_to_answer), ("About me", about_me)):
        text = "\n".join(line.rstrip() for line in (text or "").strip().splitlines())
        if not is_text(text):
            raise ChatError(f"{name} holds a character that is not text (a lone surrogate)")
        if len(text) > MAX_CHARS:
            raise ChatError(f"{name} has {len(text):,} characters; custom instructions keep "
                            f"at most {MAX_CHARS:,} in each field")
        texts.append(text)
    return Instructions(*texts)
