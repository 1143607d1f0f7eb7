"""ChatService: chats and turns. One turn = render -> prefill the new tokens -> stream -> save.

The engine is not thread-safe, so a turn holds one lock from prefill to the last token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .batches import CHUNK
from .cache import SHARED, Drop, KVCache, Restored, user_scope
from .config import GenerationConfig
from .engine import Engine, Sampling, common_prefix
from .prompt import PromptBuilder, Turn
from .store import Chat, ChatNotFound, Message, Store

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48
WARM_WAIT_S = 2.0
KNOWN_REPLIES = 1024  # replies whose exact tokens are kept for stateless clients
MAX_TITLE = 200  # characters of a chat's title
MAX_SEED = 2**32 - 2  # llama.cpp's seeds are 32-bit; 2**32 - 1 means "random"

__all__ = ["ChatService", "ChatError", "ChatNotFound", "EmptyMessage", "MessageTooLong",
           "NoModel", "TurnStats", "TurnUpdate"]


class ChatError(Exception):
    """A turn or chat action that cannot be done as asked."""


class EmptyMessage(ChatError):
    """The message is empty or only whitespace."""


class MessageTooLong(ChatError):
    """The message alone does not fit in the model's context."""


class TooManyChats(ChatError):
    """The user keeps as many chats as the server allows one user."""


class NoModel(ChatError):
    """No model is loaded; the message says why."""


@dataclass
class TurnStats:
    reused: int = 0  # history tokens whose KV was reused
    source: str = "none"  # where they came from: live / disk / prefix / none
    restore_ms: float = 0.0  # reading and loading a KV file
    prompt_tokens: int = 0
    prefilled: int = 0  # tokens evaluated for the prompt
    prefill_ms: float = 0.0
    save_ms: float = 0.0  # writing the chat's KV file after the reply
    first_token_s: float = 0.0
    generated: int = 0
    tokens_per_s: float = 0.0
    total_s: float = 0.0
    ahead: int = 0  # tokens of the next prompt's fixed head, evaluated after the reply
    first_logits: str = ""  # xxh3-64 of the logits the first token was sampled from
    typed_ahead: int = 0  # tokens of this message evaluated while it was being typed
    dropped_messages: int = 0  # oldest messages outside the model's window (context)
    shifted: int = 0  # tokens this turn dropped from the KV by a context shift
    window_recomputed: bool = False  # messages left the window and the KV could not follow
    stopped: bool = False

    def line(self) -> str:
        """The small line shown under a reply."""
        history = self.reused - self.typed_ahead  # reused before the message was typed
        if self.source in ("disk", "prefix"):
            where = "from disk" if self.source == "disk" else "from a shared prefix"
            head = f"restored {history:,} tokens {where} in {self.restore_ms:,.0f} ms"
        elif history:
            head = f"reused {history:,} tokens in memory"
        else:
            head = "no cached history"
        parts = [head] + ([f"{self.typed_ahead:,} evaluated while typing"]
                          if self.typed_ahead else []) + [
                 f"prefilled {self.prefilled:,} in {self.prefill_ms:,.0f} ms",
                 f"first token {self.first_token_s:.2f} s",
                 f"{self.generated} tokens at {self.tokens_per_s:.1f} tok/s"]
        if self.shifted:
            parts.append(f"context shifted: {self.shifted:,} oldest tokens dropped, "
                         "nothing recomputed")
        elif self.window_recomputed:
            parts.append("context full: oldest messages dropped, kept window re-evaluated")
        if self.stopped:
            parts.append("stopped")
        return " · ".join(parts)


@dataclass
class Window:
    """What the model sees in a turn: the prompt, the turns it holds, and where it starts."""

    prompt: list[int]
    turns: list[Turn]
    start: int  # position of the first message in the window
    outside: int  # messages before it
    dropped_now: int = 0  # turns that left the window in this turn
    drop: Drop | None = None  # their tokens, for the KV to follow (None: cannot)


@dataclass
class Typed:
    """What type_ahead() evaluated of a chat's next message: the prompt's tokens from start to
    end, and where the history came from the first time (a restore, say)."""

    chat_id: int
    start: int
    end: int
    restored: "Restored"

    @classmethod
    def after(cls, earlier: "Typed | None", chat_id: int, restored: "Restored",
              end: int) -> "Typed":
        if earlier is None:
            return cls(chat_id, restored.reused, end, restored)
        return cls(chat_id, min(earlier.start, restored.reused), end, earlier.restored)

    def report(self, stats: "TurnStats") -> None:
        """Fill the turn's stats: the tokens it reused thanks to the typing, and the history's
        real source (the turn itself found it all live)."""
        stats.typed_ahead = max(0, min(stats.reused, self.end) - self.start)
        if self.restored.source in ("disk", "prefix"):
            stats.source, stats.restore_ms = self.restored.source, self.restored.restore_ms


@dataclass
class TurnUpdate:
    """What a turn streams: the reply so far; the last update is done and carries the stats."""

    text: str
    done: bool = False
    stats: TurnStats | None = None
    message_id: int | None = None
    user_message_id: int | None = None
    finish_reason: str | None = None  # on the last update: "stop" or "length"
    chat_id: int | None = None
    extra: dict = field(default_factory=dict)


class Decoding:
    """One reply being sampled after the live tokens: its text so far, its exact tokens, and
    its timings. Iterating yields the text so far; a stop string ends it (cut)."""

    def __init__(self, engine: Engine, sampling: Sampling, max_tokens: int,
                 stops: tuple[str, ...], started: float):
        self.engine, self.sampling, self.max_tokens, self.stops = (
            engine, sampling, max_tokens, stops)
        self.started = started
        self.first_at: float | None = None
        self.generated: list[int] = []
        self.text = ""
        self.cut = False  # ended by a stop string: the tokens run past the text
        self.first_logits = ""
        self.finished = False  # ran to its end (not stopped by the caller)

    def __iter__(self) -> Iterator[str]:
        stream = self.engine.text_stream()
        self.first_logits = self.engine.logits_digest()
        for token in self.engine.generate(self.sampling, self.max_tokens):
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.generated.append(token)
            self.text += stream.push(token)
            stop_at = _find_stop(self.text, self.stops)
            if stop_at is not None:
                self.text, self.cut = self.text[:stop_at], True
                break
            yield self.text
        else:
            self.text += stream.flush()
        self.finished = True

    @property
    def finish_reason(self) -> str:
        return "length" if not self.cut and len(self.generated) >= self.max_tokens else "stop"

    def record(self, stats: "TurnStats") -> None:
        """Fill the stats' reply part: tokens, first token, speed, total, stopped."""
        now = time.perf_counter()
        first = self.first_at or now
        stats.generated = len(self.generated)
        stats.first_logits = self.first_logits
        stats.first_token_s = first - self.started
        gen_time = now - first
        stats.tokens_per_s = (len(self.generated) - 1) / gen_time if gen_time > 0 else 0.0
        stats.total_s = now - self.started
        stats.stopped = not self.finished


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
                 cache: KVCache | None = None, load_error: str | None = None,
                 max_chats: int = 5000):
        self.store = store
        self.max_chats = max_chats  # per user
        self._creating = threading.Lock()  # the count and the new chat, together
        self.engine = engine
        self.defaults = defaults
        self.load_error = load_error
        self.prompts = PromptBuilder(engine) if engine else None
        # Without a KV store, only the live context is reused (what plain servers do).
        self.cache = cache or (KVCache(engine, None) if engine else None)
        self.lock = threading.Lock()
        self._loading = False
        # The model a settings change is checking and loading (set by reame.settings); turns
        # wait for it, API clients are told to come back.
        self.loading_model: Path | None = None
        self._typed: Typed | None = None  # what type_ahead() evaluated of the next message
        # (model, scope, reply text) -> the exact tokens generated for it, newest last: a stateless
        # client resends the text, and the tokens make its KV reusable.
        self._reply_tokens: dict[tuple[str, str, str], tuple[int, ...]] = {}

    @property
    def loading(self) -> bool:
        """A model is being checked or loaded (a settings change), or the engine replaced."""
        return self._loading or self.loading_model is not None

    def replace_engine(self, load: Callable[[], tuple[Engine, KVCache]]) -> None:
        """Switch to the engine load() builds. Turns wait meanwhile; if it fails, the current
        engine keeps serving and the error propagates."""
        with self.lock:
            self._loading = True
            try:
                engine, cache = load()
            finally:
                self._loading = False
            old = self.engine
            if self.cache is not None:
                self.cache.flush()  # the old model's last files are complete on disk
            self.engine, self.cache = engine, cache
            self.prompts = PromptBuilder(engine)
            self.load_error = None
        if old is not None:
            old.close()
        log.info("now serving %s", engine.name)
        self.share_default_prompt()

    def set_defaults(self, defaults: GenerationConfig) -> None:
        """New chats' settings from now on (a settings change)."""
        self.defaults = defaults
        self.share_default_prompt()

    def share_default_prompt(self) -> None:
        """Make sure the KV of the default system prompt's opening is on disk as the SHARED
        snapshot every user may reuse (cache.py), and keep it from eviction: made now, when
        the model loads, so that whether it is there never depends on what users did."""
        if self.engine is None or self.cache is None or not self.cache.enabled:
            return
        with self.lock:
            head = self.prompts.fixed_head(self.defaults.system_prompt, [], SHARED)
            head = head[:len(head) - len(head) % CHUNK]
            if self.cache.pin_shared(head):
                return
            self.cache.serve(SHARED)
            self.engine.prefill_head(head)
            self.cache.save_snapshot(head, len(head), shared=True)

    # chats
    #
    # Every method that takes a chat id takes the user asking (None without accounts): a chat
    # of another user is answered as if it did not exist (ChatNotFound).

    def new_chat(self, title: str = "", system_prompt: str | None = None, *,
                 temperature: float | None = None, top_p: float | None = None,
                 max_tokens: int | None = None, user: str | None = None) -> Chat:
        d = self.defaults
        title = _checked_title(title) or DEFAULT_TITLE
        with self._creating:
            if self.store.count_chats(user) >= self.max_chats:
                raise TooManyChats(f"you have {self.max_chats:,} chats, the most this server "
                                   "keeps for one user: delete some to start a new one")
            return self.store.create_chat(
                title=title,
                system_prompt=d.system_prompt if system_prompt is None else system_prompt,
                temperature=d.temperature if temperature is None else temperature,
                top_p=d.top_p if top_p is None else top_p,
                max_tokens=d.max_tokens if max_tokens is None else max_tokens,
                owner=user,
            )

    def list_chats(self, user: str | None = None) -> list[Chat]:
        return self.store.list_chats(owner=user)

    def get_chat(self, chat_id: int, user: str | None = None) -> Chat:
        chat = self.store.get_chat(chat_id)
        if chat.owner != user:
            raise ChatNotFound(chat_id)
        return chat

    def messages(self, chat_id: int, user: str | None = None) -> list[Message]:
        return self.chat_and_messages(chat_id, user)[1]

    def chat_and_messages(self, chat_id: int,
                          user: str | None = None) -> tuple[Chat, list[Message]]:
        """A chat and its messages: what a page or /get_chat shows."""
        chat = self.get_chat(chat_id, user)
        return chat, self.store.messages(chat_id)

    def rename_chat(self, chat_id: int, title: str, user: str | None = None) -> Chat:
        self.get_chat(chat_id, user)
        title = _checked_title(title)
        if not title:
            raise ChatError("a chat title cannot be empty")
        return self.store.update_chat(chat_id, title=title)

    def update_settings(self, chat_id: int, *, system_prompt: str | None = None,
                        temperature: float | None = None, top_p: float | None = None,
                        max_tokens: int | None = None, user: str | None = None) -> Chat:
        self.get_chat(chat_id, user)
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

    def delete_chat(self, chat_id: int, user: str | None = None) -> None:
        self.get_chat(chat_id, user)
        self.store.delete_chat(chat_id)
        if self.cache:
            self.cache.forget(chat_id)

    def warm(self, chat_id: int, user: str | None = None) -> bool:
        """Restore the chat's KV from disk ahead of its next turn (called when a chat is
        opened), unless the engine stays busy. True if something was restored."""
        if self.engine is None or self.cache is None or not self.cache.enabled:
            return False
        chat = self.get_chat(chat_id, user)
        # A turn about to end (e.g. the reply being stopped by this very switch) is waited
        # for a little; a long one is not.
        if not self.lock.acquire(timeout=WARM_WAIT_S):
            return False
        try:
            return self.cache.warm(chat_id, _scope(chat)) is not None
        finally:
            self.lock.release()

    def type_ahead(self, chat_id: int, draft: str, user: str | None = None) -> int:
        """Evaluate the prompt a send of the message being typed would make, by the very
        decodes the send makes: sent as it stands, its reply starts from these logits; typed
        on, only its last chunk and what follows are evaluated again. Never waits: when a turn
        (or another draft) holds the model, nothing is done. The tokens evaluated."""
        if self.engine is None or not draft.strip() or self.cache is None:
            return 0
        chat = self.get_chat(chat_id, user)
        if not self.lock.acquire(blocking=False):
            return 0
        try:
            history = self.store.messages(chat.id)
            try:
                window = self._fit(chat, history, Turn("user", draft), None)
            except MessageTooLong:
                return 0
            if window.dropped_now:  # the turn will move the window: leave it to the turn
                return 0
            engine, prompt = self.engine, window.prompt
            if engine.ready_for(prompt):
                return 0
            restored = self.cache.prepare(chat.id, prompt, scope=_scope(chat))
            before = engine.evaluated
            engine.prefill(prompt)
            typed = self._typed if self._typed and self._typed.chat_id == chat.id else None
            self._typed = Typed.after(typed, chat.id, restored, len(prompt))
            return engine.evaluated - before
        finally:
            self.lock.release()

    def cache_stats(self, user: str | None = None, *, whole_server: bool = True) -> dict:
        """The KV cache's figures: the whole server's and its files (for an administrator),
        or only those of user's own turns."""
        if not self.cache:
            return {"enabled": False}
        return self.cache.stats(None if whole_server else user_scope(user))

    # the turn

    def _turns(self, messages: list[Message]) -> list[Turn]:
        turns = []
        for m in messages:
            exact = m.token_list if m.tokens_model == self.engine.fingerprint else None
            turns.append(Turn(m.role, m.content, tuple(exact) if exact is not None else None))
        return turns

    def _fit(self, chat: Chat, kept: list[Message], new: Turn | None,
             cut_at: int | None) -> "Window":
        """The prompt for the next reply: the chat's window (the messages from
        chat.window_start on) plus the new message. When it would not fit with room for the
        reply, the oldest messages leave the window: as few as needed to fit with room for a
        few more turns (so that the next turns do not overflow again at once)."""
        n_ctx = self.engine.n_ctx
        start = chat.window_start
        if cut_at is not None and start > cut_at:
            start = 0  # an edit of a message the model no longer saw: start over
        visible = [m for m in kept if m.position >= start]
        turns = self._turns(visible) + ([new] if new is not None else [])
        scope = _scope(chat)
        alone = self.prompts.tokens(chat.system_prompt, turns[-1:], scope)
        if len(alone) >= n_ctx:
            raise MessageTooLong(
                f"This message is {len(alone):,} tokens with the system prompt; the model's "
                f"context holds {n_ctx:,} tokens. Shorten it and send again."
            )
        prompt = self.prompts.tokens(chat.system_prompt, turns, scope)
        reply_room = min(chat.max_tokens, n_ctx // 4)
        if len(prompt) + reply_room <= n_ctx:
            return Window(prompt, turns, start, sum(m.position < start for m in kept))
        target = n_ctx - reply_room - n_ctx // 4
        cut, shorter = 0, prompt
        while cut < len(turns) - 1:
            cut += 1
            # The window starts at a user message.
            while cut < len(turns) - 1 and turns[cut].role != "user":
                cut += 1
            shorter = self.prompts.tokens(chat.system_prompt, turns[cut:], scope)
            if len(shorter) <= target:
                break
        start = visible[cut].position if cut < len(visible) else (
            kept[-1].position + 1 if kept else 0)
        at, n = common_prefix(prompt, shorter), len(prompt) - len(shorter)
        # The dropped messages must be one span of tokens for the KV to follow.
        drop = Drop(prompt, at, n) if n > 0 and prompt[at + n:] == shorter[at:] else None
        return Window(shorter, turns[cut:], start, sum(m.position < start for m in kept),
                      dropped_now=cut, drop=drop)

    def send(self, chat_id: int, text: str, *, seed: int | None = None,
             user: str | None = None, max_tokens: int | None = None,
             stop: tuple[str, ...] = ()) -> Iterator[TurnUpdate]:
        """Add the user's message and stream the reply. The reply is saved even when stopped.
        max_tokens and stop, when given, apply to this reply only (the OpenAI route)."""
        _check_text(text)
        _check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(text)
        return self._turn(chat, text, seed=seed, max_tokens=max_tokens, stop=stop)

    # stateless completions (the OpenAI route): nothing stored, the KV cache still used

    def complete(self, system_prompt: str, turns: list[Turn], *, max_tokens: int | None = None,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 stop: tuple[str, ...] = (), user: str | None = None) -> Iterator[TurnUpdate]:
        """Answer a whole conversation sent at once. Its KV is found by its tokens (the
        cache's block-hash index, within user's scope), so a conversation resent with one
        more message evaluates only that message. Refusals (no model, too long) raise before
        the first update."""
        if self.engine is None:
            raise NoModel(self.load_error or "no model is loaded")
        _check_seed(seed)
        self._check_length(system_prompt, *(t.content for t in turns))
        scope = user_scope(user)
        # Tokenized now, outside the lock (the model may be busy with another turn).
        prompts = self.prompts
        known, prompt = self._conversation(prompts, system_prompt, turns, scope)
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
        return self._complete(system_prompt, turns, (prompts, known, prompt), sampling,
                              max_tokens, stop, scope)

    def _conversation(self, prompts: PromptBuilder, system_prompt: str, turns: list[Turn],
                      scope: str) -> tuple[list[Turn], list[int]]:
        """The turns (replies this server wrote with their exact tokens) and the prompt, in
        the vocabulary of prompts' model; too long for its context raises MessageTooLong."""
        known = [self._known_reply(prompts.engine, t, scope) for t in turns]
        prompt = prompts.tokens(system_prompt, known, scope)
        n_ctx = prompts.engine.n_ctx
        if len(prompt) >= n_ctx:
            raise MessageTooLong(
                f"The conversation is {len(prompt):,} tokens; the model's context holds "
                f"{n_ctx:,} tokens. Shorten it and send again.")
        return known, prompt

    def _known_reply(self, engine: Engine, turn: Turn, scope: str) -> Turn:
        """An assistant turn with the exact tokens this server generated for its text, in a
        reply to the same scope (another user's replies must not change this prompt)."""
        if turn.role != "assistant" or turn.tokens is not None:
            return turn
        tokens = self._reply_tokens.get((engine.fingerprint, scope, turn.content))
        return Turn(turn.role, turn.content, tokens) if tokens else turn

    def _complete(self, system_prompt: str, sent: list[Turn],
                  tokenized: tuple[PromptBuilder, list[Turn], list[int]],
                  sampling: Sampling, max_tokens: int | None,
                  stop: tuple[str, ...], scope: str) -> Iterator[TurnUpdate]:
        with self.lock:
            prompts, turns, prompt = tokenized
            if prompts is not self.prompts:  # the model was switched meanwhile: its tokens
                turns, prompt = self._conversation(self.prompts, system_prompt, sent, scope)
            engine = self.engine
            stats = TurnStats(prompt_tokens=len(prompt))
            started = time.perf_counter()
            restored = self.cache.prepare(None, prompt, scope=scope)
            stats.reused, stats.source, stats.restore_ms = (
                restored.reused, restored.source, restored.restore_ms)
            before = engine.evaluated
            if engine.prefill(prompt) == len(prompt):  # the same prompt's logits are live
                stats.reused = len(prompt)
            stats.prefilled = engine.evaluated - before
            stats.prefill_ms = (time.perf_counter() - started) * 1000 - stats.restore_ms
            limit = min(max_tokens or self.defaults.max_tokens, engine.n_ctx - len(prompt))
            decoding = Decoding(engine, sampling, limit, self.prompts.stops + stop, started)
            try:
                for text in decoding:
                    yield TurnUpdate(text)
            finally:
                decoding.record(stats)
                if decoding.finished and not decoding.cut:
                    self._remember_reply(scope, decoding.text.strip(), decoding.generated)
                    stats.ahead = self._prefill_next_header(system_prompt, turns, scope,
                                                            decoding.generated)
                stats.save_ms = self.cache.save_conversation()
            log.info("completion: %s", stats.line())
            yield TurnUpdate(decoding.text.strip(), done=True, stats=stats,
                             finish_reason=decoding.finish_reason)

    def _remember_reply(self, scope: str, text: str, tokens: list[int]) -> None:
        key = (self.engine.fingerprint, scope, text)
        self._reply_tokens.pop(key, None)
        self._reply_tokens[key] = tuple(tokens)
        while len(self._reply_tokens) > KNOWN_REPLIES:
            self._reply_tokens.pop(next(iter(self._reply_tokens)))

    def regenerate(self, chat_id: int, *, seed: int | None = None,
                   user: str | None = None) -> Iterator[TurnUpdate]:
        """Replace the last reply with a new one; the history's KV is reused up to it."""
        _check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        messages = self.store.messages(chat_id)
        if not messages:
            raise ChatError("there is no reply to regenerate: the chat is empty")
        return self._turn(chat, None, cut_at=messages[-1].position if messages[-1].role ==
                          "assistant" else None, seed=seed)

    def edit_message(self, chat_id: int, message_id: int, text: str, *,
                     seed: int | None = None, user: str | None = None) -> Iterator[TurnUpdate]:
        """Replace one of the user's messages (and drop what followed it), then answer it."""
        _check_text(text)
        _check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(text)
        target = next((m for m in self.store.messages(chat_id) if m.id == message_id), None)
        if target is None:
            raise ChatError(f"message {message_id} is not in chat {chat_id}")
        if target.role != "user":
            raise ChatError("only the user's messages can be edited")
        return self._turn(chat, text, cut_at=target.position, seed=seed)

    def _check_length(self, *texts: str) -> None:
        """Refuse, before tokenizing them, texts too long for the context whatever their
        tokens: no token is longer than the model's longest (bytes)."""
        size = sum(len(t.encode("utf-8", errors="replace")) for t in texts)
        n_ctx = self.engine.n_ctx
        if size > n_ctx * self.engine.max_token_bytes:
            raise MessageTooLong(
                f"This text is {size:,} bytes: more than the model's context of {n_ctx:,} "
                f"tokens can hold. Shorten it and send again.")

    def _chat_for_turn(self, chat_id: int, user: str | None) -> Chat:
        chat = self.get_chat(chat_id, user)
        if self.engine is None:
            raise NoModel(self.load_error or "no model is loaded")
        return chat

    def _turn(self, chat: Chat, text: str | None, *, cut_at: int | None = None,
              seed: int | None, max_tokens: int | None = None,
              stop: tuple[str, ...] = ()) -> Iterator[TurnUpdate]:
        with self.lock:
            typed, self._typed = self._typed, None
            restoring = self._restore_meanwhile(chat)
            try:
                history = self.store.messages(chat.id)
                kept = [m for m in history if cut_at is None or m.position < cut_at]
                window = self._fit(chat, kept,
                                   Turn("user", text) if text is not None else None, cut_at)
                if cut_at is not None:
                    self.store.delete_messages_from(chat.id, cut_at)
                if window.start != chat.window_start:
                    chat = self.store.update_chat(chat.id, window_start=window.start)
                user_message_id = None
                if text is not None:
                    user_message_id = self.store.add_message(chat.id, "user", text).id
                    if chat.title == DEFAULT_TITLE and not kept:
                        self.store.update_chat(chat.id, title=title_from(text))
            finally:
                if restoring is not None:
                    restoring.join()
            yield from self._reply(chat, window, seed, user_message_id,
                                   typed=typed if typed and typed.chat_id == chat.id else None,
                                   max_tokens=max_tokens, stop=stop)

    def _restore_meanwhile(self, chat: Chat) -> threading.Thread | None:
        """Start restoring the chat's KV file (as when a chat is opened) while the turn reads
        the database and tokenizes the prompt: llama.cpp's copy and the tokenizer both
        release the GIL. The caller joins the thread before the engine is used again."""
        if self.cache is None or not self.cache.enabled or self.cache.holds(chat.id):
            return None

        def restore() -> None:
            try:
                self.cache.warm(chat.id, _scope(chat))
            except Exception:  # a failed restore is a miss: the turn looks up again
                log.exception("restoring chat %d's KV ahead of its turn failed", chat.id)

        thread = threading.Thread(target=restore, name="kv-restore", daemon=True)
        thread.start()
        return thread

    def _prefill(self, chat: Chat, window: "Window", stats: TurnStats) -> None:
        """Restore what the cache has, snapshot a shared prefix if new, evaluate the rest."""
        engine, cache, prompt = self.engine, self.cache, window.prompt
        restored = cache.prepare(chat.id, prompt, window.drop, scope=_scope(chat))
        stats.reused, stats.source, stats.restore_ms = (
            restored.reused, restored.source, restored.restore_ms)
        if window.dropped_now:
            stats.shifted = restored.shifted
            stats.window_recomputed = not restored.shifted
        started = time.perf_counter()
        before = engine.evaluated
        if cache.enabled:  # a shared-prefix snapshot only makes sense with files to keep it
            opening = self.prompts.fixed_head(chat.system_prompt, [], _scope(chat))
            snapshot = cache.prefix_length(opening, prompt)
            # The default system prompt's opening is the administrator's: every user's.
            shared = chat.system_prompt == self.defaults.system_prompt
            if restored.reused < snapshot and cache.wants_snapshot(snapshot, prompt,
                                                                   shared=shared):
                engine.prefill_head(prompt[:snapshot])  # whole chunks: the plan is unchanged
                cache.save_snapshot(prompt, snapshot, shared=shared)
        if engine.prefill(prompt) == len(prompt):  # typed ahead: its logits are live
            stats.reused = len(prompt)
        seconds = time.perf_counter() - started
        stats.prefilled = engine.evaluated - before
        stats.prefill_ms = seconds * 1000
        cache.record_prefill(stats.prefilled, seconds)

    def _reply(self, chat: Chat, window: "Window", seed: int | None,
               user_message_id: int | None, *, max_tokens: int | None = None,
               stop: tuple[str, ...] = (), typed: "Typed | None" = None) -> Iterator[TurnUpdate]:
        engine, prompt, turns = self.engine, window.prompt, window.turns
        stats = TurnStats(prompt_tokens=len(prompt), dropped_messages=window.outside)
        started = time.perf_counter()
        sampling = Sampling(temperature=chat.temperature, top_p=chat.top_p, seed=seed)
        self._prefill(chat, window, stats)
        if typed is not None and stats.source == "live":
            typed.report(stats)
        max_tokens = min(max_tokens or chat.max_tokens, engine.n_ctx - len(prompt))
        decoding = Decoding(engine, sampling, max_tokens, self.prompts.stops + stop, started)
        try:
            for text in decoding:
                yield TurnUpdate(text, user_message_id=user_message_id, chat_id=chat.id)
        finally:
            decoding.record(stats)
            message = None
            # The chat may have been deleted while it was answering: then save nothing.
            if self.store.has_chat(chat.id):
                if decoding.finished and not decoding.cut:
                    stats.ahead = self._prefill_next_header(chat.system_prompt, turns,
                                                            _scope(chat),
                                                            decoding.generated)
                    stats.total_s = time.perf_counter() - started
                stats.save_ms = self.cache.save(chat.id)
                reply = decoding.text
                message = self.store.add_message(
                    chat.id, "assistant", reply.strip() if decoding.finished else reply,
                    # A reply cut at a stop string holds tokens past its text: re-tokenize it.
                    tokens=None if decoding.cut else decoding.generated,
                    tokens_model=engine.fingerprint, stats=asdict(stats), stopped=stats.stopped,
                )
                log.info("chat %s: %s", chat.id, stats.line())
        if message is None:
            raise ChatNotFound(chat.id)
        yield TurnUpdate(decoding.text.strip(), done=True, stats=stats, message_id=message.id,
                         user_message_id=user_message_id, chat_id=chat.id,
                         finish_reason=decoding.finish_reason)

    def _prefill_next_header(self, system_prompt: str, turns: list[Turn], scope: str,
                             generated: list[int]) -> int:
        """Evaluate now what the next prompt will hold whatever the user writes (e.g.
        "<|im_end|>\n<|im_start|>user\n"), so the next turn's first token waits only for the
        message itself. The next turn checks these tokens like any others (common prefix)."""
        engine = self.engine
        done = turns + [Turn("assistant", "", tuple(generated))]
        head = self.prompts.fixed_head(system_prompt, done, scope)
        live = len(engine.tokens)
        if not live < len(head) <= engine.n_ctx or engine.common_prefix(head) != live:
            return 0
        engine.extend(head[live:])
        return len(head) - live



def _scope(chat: Chat) -> str:
    """The cache scope of a chat's turns: its owner's."""
    return user_scope(chat.owner)


def _checked_title(title: str) -> str:
    title = " ".join(title.split())
    if len(title) > MAX_TITLE:
        raise ChatError(f"a chat title has at most {MAX_TITLE} characters")
    return title


def _check_seed(seed: int | None) -> None:
    if seed is not None and not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ChatError(f"a seed is an integer from 0 to {MAX_SEED}")


def _check_text(text: str) -> None:
    if not text or not text.strip():
        raise EmptyMessage("the message is empty")


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [text.find(s) for s in stops if s in text]
    return min(found) if found else None
