"""ChatService: chats and turns. One turn = render -> prefill the new tokens -> stream -> save.

The engine is not thread-safe, so a turn holds one lock from prefill to the last token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from .config import GenerationConfig
from .engine import Engine, Sampling
from .prompt import PromptBuilder, Turn
from .store import Chat, ChatNotFound, Message, Store

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48

__all__ = ["ChatService", "ChatError", "ChatNotFound", "EmptyMessage", "MessageTooLong",
           "NoModel", "TurnStats", "TurnUpdate"]


class ChatError(Exception):
    """A turn or chat action that cannot be done as asked."""


class EmptyMessage(ChatError):
    """The message is empty or only whitespace."""


class MessageTooLong(ChatError):
    """The message alone does not fit in the model's context."""


class NoModel(ChatError):
    """No model is loaded; the message says why."""


@dataclass
class TurnStats:
    reused: int = 0  # history tokens whose KV was reused
    source: str = "none"  # where they came from: live / none
    prompt_tokens: int = 0
    prefilled: int = 0  # tokens evaluated for the prompt
    prefill_ms: float = 0.0
    first_token_s: float = 0.0
    generated: int = 0
    tokens_per_s: float = 0.0
    total_s: float = 0.0
    dropped_messages: int = 0  # oldest messages left out to fit the context
    stopped: bool = False

    def line(self) -> str:
        """The small line shown under a reply."""
        if self.reused:
            head = f"reused {self.reused:,} tokens ({self.source})"
        else:
            head = "no cached history"
        parts = [head, f"prefilled {self.prefilled:,} in {self.prefill_ms:,.0f} ms",
                 f"first token {self.first_token_s:.2f} s",
                 f"{self.generated} tokens at {self.tokens_per_s:.1f} tok/s"]
        if self.dropped_messages:
            parts.append(f"{self.dropped_messages} oldest messages outside the model's memory")
        if self.stopped:
            parts.append("stopped")
        return " · ".join(parts)


@dataclass
class TurnUpdate:
    """What a turn streams: the reply so far; the last update is done and carries the stats."""

    text: str
    done: bool = False
    stats: TurnStats | None = None
    message_id: int | None = None
    user_message_id: int | None = None
    extra: dict = field(default_factory=dict)


def title_from(text: str) -> str:
    """The first words of a message, cut at a word boundary."""
    line = " ".join(text.split())
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    if " " in cut[TITLE_LENGTH // 2:]:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:.") + "…"


class ChatService:
    """Everything a user can do with chats; the UI and the API are thin layers over it."""

    def __init__(self, store: Store, engine: Engine | None, defaults: GenerationConfig, *,
                 load_error: str | None = None):
        self.store = store
        self.engine = engine
        self.defaults = defaults
        self.load_error = load_error
        self.prompts = PromptBuilder(engine) if engine else None
        self.lock = threading.Lock()

    # chats

    def new_chat(self, title: str = "", system_prompt: str | None = None, *,
                 temperature: float | None = None, top_p: float | None = None,
                 max_tokens: int | None = None) -> Chat:
        d = self.defaults
        return self.store.create_chat(
            title=title.strip() or DEFAULT_TITLE,
            system_prompt=d.system_prompt if system_prompt is None else system_prompt,
            temperature=d.temperature if temperature is None else temperature,
            top_p=d.top_p if top_p is None else top_p,
            max_tokens=d.max_tokens if max_tokens is None else max_tokens,
        )

    def list_chats(self) -> list[Chat]:
        return self.store.list_chats()

    def get_chat(self, chat_id: int) -> Chat:
        return self.store.get_chat(chat_id)

    def messages(self, chat_id: int) -> list[Message]:
        self.store.get_chat(chat_id)
        return self.store.messages(chat_id)

    def rename_chat(self, chat_id: int, title: str) -> Chat:
        title = " ".join(title.split())
        if not title:
            raise ChatError("a chat title cannot be empty")
        return self.store.update_chat(chat_id, title=title)

    def update_settings(self, chat_id: int, *, system_prompt: str | None = None,
                        temperature: float | None = None, top_p: float | None = None,
                        max_tokens: int | None = None) -> Chat:
        fields = {k: v for k, v in dict(system_prompt=system_prompt, temperature=temperature,
                                         top_p=top_p, max_tokens=max_tokens).items()
                  if v is not None}
        if "temperature" in fields and not 0 <= fields["temperature"] <= 2:
            raise ChatError("temperature must be between 0 and 2")
        if "top_p" in fields and not 0 < fields["top_p"] <= 1:
            raise ChatError("top_p must be above 0 and at most 1")
        if "max_tokens" in fields and not 1 <= int(fields["max_tokens"]) <= 32768:
            raise ChatError("max_tokens must be between 1 and 32768")
        return self.store.update_chat(chat_id, **fields)

    def delete_chat(self, chat_id: int) -> None:
        self.store.delete_chat(chat_id)

    # the turn

    def _turns(self, messages: list[Message]) -> list[Turn]:
        turns = []
        for m in messages:
            exact = m.token_list if m.tokens_model == self.engine.fingerprint else None
            turns.append(Turn(m.role, m.content, tuple(exact) if exact is not None else None))
        return turns

    def _fit(self, chat: Chat, turns: list[Turn]) -> tuple[list[int], int]:
        """Prompt tokens for turns, dropping the oldest messages if they do not fit with a reply."""
        n_ctx = self.engine.n_ctx
        alone = self.prompts.tokens(chat.system_prompt, turns[-1:])
        if len(alone) >= n_ctx:
            raise MessageTooLong(
                f"This message is {len(alone):,} tokens with the system prompt; the model's "
                f"context holds {n_ctx:,} tokens. Shorten it and send again."
            )
        reply_room = min(chat.max_tokens, n_ctx // 4)
        dropped = 0
        while True:
            prompt = self.prompts.tokens(chat.system_prompt, turns[dropped:])
            if len(prompt) + reply_room <= n_ctx or dropped >= len(turns) - 1:
                return prompt, dropped
            dropped += 1
            # Keep the kept part starting at a user message.
            while dropped < len(turns) - 1 and turns[dropped].role != "user":
                dropped += 1

    def send(self, chat_id: int, text: str, *, seed: int | None = None) -> Iterator[TurnUpdate]:
        """Add the user's message and stream the reply. The reply is saved even when stopped."""
        if not text or not text.strip():
            raise EmptyMessage("the message is empty")
        if self.engine is None:
            raise NoModel(self.load_error or "no model is loaded")
        chat = self.store.get_chat(chat_id)
        return self._turn(chat, text, seed)

    def _turn(self, chat: Chat, text: str, seed: int | None) -> Iterator[TurnUpdate]:
        with self.lock:
            history = self.store.messages(chat.id)
            turns = self._turns(history) + [Turn("user", text)]
            prompt, dropped = self._fit(chat, turns)
            user_message = self.store.add_message(chat.id, "user", text)
            if chat.title == DEFAULT_TITLE and not history:
                self.store.update_chat(chat.id, title=title_from(text))
            yield from self._reply(chat, prompt, dropped, seed, user_message.id)

    def _reply(self, chat: Chat, prompt: list[int], dropped: int, seed: int | None,
               user_message_id: int | None) -> Iterator[TurnUpdate]:
        engine = self.engine
        stats = TurnStats(prompt_tokens=len(prompt), dropped_messages=dropped)
        started = time.perf_counter()
        before = engine.evaluated
        reused = engine.prefill(prompt)
        stats.reused = reused
        stats.source = "live" if reused else "none"
        stats.prefilled = engine.evaluated - before
        stats.prefill_ms = (time.perf_counter() - started) * 1000
        sampling = Sampling(temperature=chat.temperature, top_p=chat.top_p, seed=seed)
        max_tokens = min(chat.max_tokens, engine.n_ctx - len(prompt))
        stream = engine.text_stream()
        generated: list[int] = []
        reply = ""
        cut = False
        first_at = None
        finished = False
        try:
            for token in engine.generate(sampling, max_tokens):
                if first_at is None:
                    first_at = time.perf_counter()
                generated.append(token)
                reply += stream.push(token)
                stop_at = _find_stop(reply, self.prompts.stops)
                if stop_at is not None:
                    reply, cut = reply[:stop_at], True
                    break
                yield TurnUpdate(reply, user_message_id=user_message_id)
            else:
                reply += stream.flush()
            finished = True
        finally:
            now = time.perf_counter()
            stats.generated = len(generated)
            stats.first_token_s = ((first_at or now) - started)
            gen_time = now - (first_at or now)
            stats.tokens_per_s = (len(generated) - 1) / gen_time if gen_time > 0 else 0.0
            stats.total_s = now - started
            stats.stopped = not finished
            message = self.store.add_message(
                chat.id, "assistant", reply.strip() if finished else reply,
                # A reply cut at a stop string holds tokens past its text: re-tokenize it instead.
                tokens=None if cut else generated, tokens_model=engine.fingerprint,
                stats=asdict(stats), stopped=stats.stopped,
            )
            log.info("chat %s: %s", chat.id, stats.line())
        yield TurnUpdate(reply.strip(), done=True, stats=stats, message_id=message.id,
                         user_message_id=user_message_id)


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [text.find(s) for s in stops if s in text]
    return min(found) if found else None
