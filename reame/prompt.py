"""A chat -> the prompt's tokens, with the model's own chat template.

Assistant replies are spliced in as the exact tokens the model generated (when they are known
for this model): re-tokenizing a reply's text need not give them back, and the KV holds the
generated ones. The prompt of turn n+1 then starts with every token of turn n's KV.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from .engine import Engine, common_prefix

# For models without a chat template (base models): plain labelled turns.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_STOPS = ("\nUser:", "\nAssistant:")

_SENTINEL = "\x1eREAME-{}\x1e"
PIECE_CACHE = 4096  # tokenized pieces kept per model (a piece: a user message with its template)
_SENTINEL_RE = re.compile("\x1eREAME-(\\d+)\x1e")


@dataclass(frozen=True)
class Turn:
    role: str  # "user" | "assistant"
    content: str
    tokens: tuple[int, ...] | None = None  # exact generated tokens, for assistant turns


class PromptBuilder:
    """Renders chats into token lists for one engine's model."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.has_template = bool(engine.chat_template)
        template = engine.chat_template or PLAIN_TEMPLATE
        self.stops: tuple[str, ...] = () if self.has_template else PLAIN_STOPS
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=engine.token_text(engine.eos_token),
            bos_token=engine.token_text(engine.bos_token) if engine.bos_token >= 0 else "",
        )
        self._bos_text = self._formatter.bos_token
        self._pieces: dict[tuple[str, bool], tuple[int, ...]] = {}

    def render_text(self, system_prompt: str, turns: list[Turn]) -> str:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages += [{"role": t.role, "content": t.content} for t in turns]
        return self._formatter(messages=messages).prompt

    def tokens(self, system_prompt: str, turns: list[Turn]) -> list[int]:
        """The prompt for the next reply: the chat, then the template's assistant header."""
        spliced = [
            Turn(t.role, _SENTINEL.format(i), t.tokens) if t.tokens is not None else t
            for i, t in enumerate(turns)
        ]
        text = self.render_text(system_prompt, spliced)
        add_bos = self.engine.adds_bos and not (self._bos_text and text.startswith(self._bos_text))
        pieces = _SENTINEL_RE.split(text)
        out: list[int] = []
        # split() alternates: text, index, text, index, ..., text
        for n, piece in enumerate(pieces):
            if n % 2:
                out.extend(turns[int(piece)].tokens)
            else:
                out.extend(self._piece_tokens(piece, add_bos and n == 0))
        return out

    def fixed_head(self, system_prompt: str, turns: list[Turn]) -> list[int]:
        """The tokens of the prompt for turns + a next user message that no message can change
        (the next turn's header): the common prefix of the prompts for messages "a" and "b"."""
        a = self.tokens(system_prompt, turns + [Turn("user", "a")])
        b = self.tokens(system_prompt, turns + [Turn("user", "b")])
        return a[:common_prefix(a, b)]

    def _piece_tokens(self, piece: str, add_bos: bool) -> tuple[int, ...]:
        """A piece of the rendered chat between exact-token replies. The same pieces come back
        every turn (each earlier user message with its template): each is tokenized once, and
        the oldest are forgotten past PIECE_CACHE."""
        key = (piece, add_bos)
        tokens = self._pieces.get(key)
        if tokens is None:
            if len(self._pieces) >= PIECE_CACHE:
                self._pieces.pop(next(iter(self._pieces)), None)
            tokens = self._pieces[key] = tuple(self.engine.tokenize(piece, add_bos=add_bos))
        return tokens
