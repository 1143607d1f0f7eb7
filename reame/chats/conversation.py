"""Stateless conversations (the OpenAI routes): a whole conversation sent with every request.

Nothing is stored but the KV: a conversation's file is found again by its tokens (the cache's
block-hash index, within the asker's scope). For that, a reply resent as text must become the
very tokens that were generated for it: ReplyMemory keeps them, per model and scope.
"""

from __future__ import annotations

from reame.config.refusals import MessageTooLong
from reame.inference.prompt import PromptBuilder, PromptMessage
from reame.inference.scope import Scope
from reame.inference.tools import Tool, canonical
from reame.inference.turn import Decoding, TurnStats

KNOWN_REPLIES = 1024  # replies whose exact tokens are kept for stateless clients
# A stateless conversation's sampling where its request names none: OpenAI's defaults.
STATELESS_TEMPERATURE = 1.0
STATELESS_TOP_P = 1.0


class ReplyMemory:
    """(model, scope, reply text) -> the exact tokens generated for it, newest last."""

    def __init__(self, size: int = KNOWN_REPLIES):
        self.size = size
        self._tokens: dict[tuple[str, Scope, str], tuple[int, ...]] = {}

    def tokenize(self, prompts: PromptBuilder, system_prompt: str, turns: list[PromptMessage],
                 scope: Scope, tools: tuple[Tool, ...] = ()
                 ) -> tuple[list[PromptMessage], list[int]]:
        """The turns (replies this server wrote with their exact tokens) and the prompt, in
        the vocabulary of prompts' model; too long for its context raises MessageTooLong."""
        known = [self._known(prompts.engine.fingerprint, t, scope) for t in turns]
        prompt = prompts.tokens(system_prompt, known, scope, tools)
        n_ctx = prompts.engine.n_ctx
        if len(prompt) >= n_ctx:
            raise MessageTooLong(
                f"The conversation is {len(prompt):,} tokens; the model's context holds "
                f"{n_ctx:,} tokens. Shorten it and send again.")
        return known, prompt

    def _known(self, model: str, turn: PromptMessage, scope: Scope) -> PromptMessage:
        """An assistant turn with the exact tokens this server generated for its text, in a
        reply to the same scope (another user's replies must not change this prompt)."""
        if turn.role != "assistant" or turn.tokens is not None:
            return turn
        tokens = self._tokens.get((model, scope, turn.content))
        return PromptMessage(turn.role, turn.content, tokens) if tokens else turn

    def remember(self, model: str, scope: Scope, text: str, tokens: list[int]) -> None:
        key = (model, scope, text)
        self._tokens.pop(key, None)
        self._tokens[key] = tuple(tokens)
        while len(self._tokens) > self.size:
            self._tokens.pop(next(iter(self._tokens)))


class ConversationKeeper:
    """A stateless turn's Keeper (turn.py): its KV file is saved by the runner; a reply that
    ran to its end is remembered with its exact tokens."""

    def __init__(self, memory: ReplyMemory, model: str, scope: Scope):
        self.memory, self.model, self.scope = memory, model, scope

    def alive(self) -> bool:
        return True

    def keep(self, decoding: Decoding, stats: TurnStats) -> None:
        tokens = decoding.exact_tokens
        if tokens is not None:
            text = decoding.text.strip()
            self.memory.remember(self.model, self.scope, text, tokens)
            # A reply that called tools comes back as its parts, which render as this text.
            again = canonical(text)
            if again is not None:
                self.memory.remember(self.model, self.scope, again, tokens)


class PlainKeeper:
    """A raw text completion's Keeper (/v1/completions): its KV file is saved by the runner,
    found again by the tokens of the text resent; there is no reply to remember (the text
    grown by the reply is tokenized whole, as a fresh request's would be)."""

    def alive(self) -> bool:
        return True

    def keep(self, decoding: Decoding, stats: TurnStats) -> None:
        return None
