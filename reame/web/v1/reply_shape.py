"""A /v1/chat/completions reply in OpenAI's shape: its text as `content`, or, when the request
offered tools, the text before its calls as `content` and each call (tools.py's format) as a
`tool_calls` entry; streamed, text that may still become a call is held back until it does."""

from __future__ import annotations

import uuid

from reame.chats.messages import call_id
from reame.inference.tools import CALL_OPEN, ToolCall, pending_text, split_calls, split_reply


class ReplyShape:
    """How one reply's text becomes OpenAI's message: tools on (calls split out) or off."""

    def __init__(self, calls_tools: bool, id_prefix: str | None = None):
        self.calls_tools = calls_tools
        self.id_prefix = id_prefix  # a stored chat's turn: its calls' ids as the chat keeps them
        self._ids: list[str] = []  # a call's id, by its index: the same streamed or not

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The whole reply's message and its finish_reason ("tool_calls" when it called)."""
        content, calls = self.parts(text)
        if not calls:
            return {"role": "assistant", "content": content}, finish_reason
        return ({"role": "assistant", "content": content or None,
                 "tool_calls": [self.call(n, c) for n, c in enumerate(calls)]},
                _called(finish_reason))

    def parts(self, text: str) -> tuple[str, list[ToolCall]]:
        """The reply's content and its calls. A call begun and never finished (max_tokens or
        a stop cut it) is no content: its markup is dropped, never shown as the reply's words."""
        if not self.calls_tools:
            return text, []
        content, calls = split_reply(text)
        begun = content.find(CALL_OPEN)
        return (content if begun < 0 else content[:begun].rstrip()), calls

    def shown(self, text: str, done: bool) -> tuple[str, list[ToolCall]]:
        """What a stream may send of a reply so far: its content (without a tail that may
        become a call, and without whitespace at either end), and its calls complete."""
        if done:
            return self.parts(text)
        # The whole reply is stripped (turn.py): so is what streams of it, the whitespace at
        # its end held back until more words come.
        if not self.calls_tools:
            return text.strip(), []
        content, calls, _ = split_calls(text)  # text after the calls waits for the end
        if calls:
            return content.strip(), calls
        return text[:pending_text(text)].strip(), []

    def call(self, index: int, call: ToolCall) -> dict:
        while len(self._ids) <= index:
            self._ids.append(f"call_{uuid.uuid4().hex[:24]}" if self.id_prefix is None
                             else call_id(self.id_prefix, len(self._ids)))
        return {"id": self._ids[index], "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}

    def finish(self, text: str, finish_reason: str | None) -> str | None:
        return _called(finish_reason) if self.parts(text)[1] else finish_reason


def _called(finish_reason: str | None) -> str | None:
    # A reply whose calls are whole ended because it called ("length" stays: it was cut).
    return "tool_calls" if finish_reason == "stop" else finish_reason


def logprob_entries(choices, vocab) -> list[dict]:
    """OpenAI's logprobs.content: per token its text, log-probability, UTF-8 bytes and the
    most likely tokens there."""
    def entry(token: int, logprob: float) -> dict:
        piece = vocab.token_piece(token, special=True)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}

    return [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, p) for t, p in c.top]}
            for c in choices]
