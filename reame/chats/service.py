"""ChatService: chats (create, read, change, delete; each user sees only their own) and turns.

A stored chat's turn: its window of messages (window.py) becomes a Job for the TurnRunner
(turn.py), and the reply is kept as the chat's message and KV file (ChatKeeper). A stateless
conversation (the OpenAI route) is the same run with another Job and Keeper (conversation.py).
Turns run on the engine's thread (scheduler.py), several at once, each on its own slot; two
turns of one chat take turns (the second reads the history once the first's reply is kept). The
model and everything made for it is one ModelRuntime, replaced in one step at a model switch
(model_runtime.py). Every turn is a TurnStream: it ends, and frees its slot, however its caller
goes away (turn_stream.py, scheduler.py).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from reame.chats.conversation import ConversationKeeper, ReplyMemory
from reame.chats.jsontext import lone_surrogate
from reame.chats.store import Chat, Found, Message, MessageNotFound, Store, Thread
from reame.chats.titles import DEFAULT_TITLE, checked_title, title_from
from reame.chats.transfer import BadImport, export_all, export_chat, parse_import, to_markdown
from reame.chats.window import Window, fit
from reame.config.chat_settings import ChatSettings
from reame.config.refusals import (
    ChatError,
    ChatNotFound,
    EmptyMessage,
    MessageTooLong,
    NoModel,
    ServerBusy,
    TooManyChats,
    check_seed,
    check_text,
)
from reame.inference.cache import SHARED, KVCache, user_scope
from reame.inference.engine import Engine, Sampling
from reame.inference.model_runtime import ModelRuntime
from reame.inference.prompt import PromptBuilder, Turn
from reame.inference.scheduler import Limits, Replaced, Scheduler, Stopped, Waiting
from reame.inference.turn import Decoding, Job, TurnObserver, TurnRunner, TurnStats, TurnUpdate
from reame.inference.turn_stream import TurnStream

log = logging.getLogger(__name__)

__all__ = ["ChatService", "ChatError", "ChatNotFound", "EmptyMessage", "MessageTooLong",
           "NoModel", "ServerBusy", "TooManyChats", "TurnStats", "TurnUpdate", "title_from"]


class ChatKeeper:
    """A stored chat's Keeper (turn.py): the reply becomes the chat's next message, with its
    exact tokens and stats; nothing is kept if the chat was deleted while it answered."""

    def __init__(self, store: Store, chat_id: int, owner: str | None, model: str,
                 after: int | None):
        self.store, self.chat_id, self.owner, self.model = store, chat_id, owner, model
        self.after = after  # the message the reply follows (the user may show another meanwhile)

    def alive(self) -> bool:
        return self.store.has_chat(self.chat_id, self.owner)

    def keep(self, decoding: Decoding, stats: TurnStats) -> int:
        reply = decoding.text
        return self.store.add_message(
            self.chat_id, "assistant", reply.strip() if decoding.finished else reply,
            # A reply cut at a stop string holds tokens past its text: re-tokenize it.
            tokens=None if decoding.cut else decoding.generated,
            tokens_model=self.model, stats=asdict(stats), stopped=stats.stopped,
            after=self.after, expect_owner=self.owner).id


class ChatService:
    """Everything a user can do with chats; the UI and the API are thin layers over it."""

    def __init__(self, store: Store, engine: Engine | None, defaults: ChatSettings, *,
                 cache: KVCache | None = None, load_error: str | None = None,
                 max_chats: int = 5000, limits: Limits = Limits()):
        self.store = store
        self.max_chats = max_chats  # per user
        self._creating = threading.Lock()  # the count and the reservations, together
        self._reserved: dict[str | None, int] = {}  # user -> chats being made now
        self.defaults = defaults
        self.load_error = load_error
        self.limits = limits  # the line, stalled callers, fair shares (scheduler.py)
        # Without KV files, only the live context is reused (what plain servers do); without
        # an engine there is no runtime at all (None), and every path that uses it checks.
        self.runtime: ModelRuntime | None = (
            ModelRuntime(engine, cache or KVCache(engine, None), limits) if engine else None)
        self._switch = threading.Condition()  # a model switch under way: turns wait for it
        self._loading = False
        # The model a settings change is checking and loading (loading_from); turns wait for
        # it, API clients are told to come back.
        self.loading_model: Path | None = None
        self.replies = ReplyMemory()  # stateless replies' exact tokens
        self.observe_turn: TurnObserver | None = None  # told of every turn (metrics)
        self.warming = False  # the model runs once at start (warmup.py): not ready yet

    # The current runtime's parts (None without a model). A turn takes the runtime once and
    # uses it throughout; these are for reading (metrics, the page, tests).

    @property
    def engine(self) -> Engine | None:
        return self.runtime.engine if self.runtime else None

    @property
    def cache(self) -> KVCache | None:
        return self.runtime.cache if self.runtime else None

    @property
    def prompts(self) -> PromptBuilder | None:
        return self.runtime.prompts if self.runtime else None

    @property
    def scheduler(self) -> Scheduler | None:
        return self.runtime.scheduler if self.runtime else None

    @property
    def max_waiting(self) -> int:
        return self.limits.max_waiting

    @contextmanager
    def using_model(self) -> Iterator[ModelRuntime]:
        """The current runtime, leased for the block (its engine stays open): once a model
        switch under way is done; NoModel without one. For straight-line work only."""
        while True:
            runtime = self._current()
            try:
                with runtime.lease():
                    yield runtime
                return
            except Replaced:
                if runtime.retired and self.runtime is not runtime:
                    continue  # switched meanwhile: the new one
                raise

    def _current(self) -> ModelRuntime:
        """The runtime turns go to, once a model switch under way is done (NoModel: none)."""
        with self._switch:
            # Also while a new model is only checked: the page already says it loads, and a
            # turn begun on the old model now would be stopped by the switch a moment later.
            while self._loading or self.loading_model is not None:
                self._switch.wait()
            runtime = self.runtime
        if runtime is None:
            raise NoModel(self.load_error or "no model is loaded")
        return runtime

    @property
    def loading(self) -> bool:
        """A model is being checked or loaded (a settings change), or the engine replaced."""
        return self._loading or self.loading_model is not None

    @contextmanager
    def loading_from(self, path: Path) -> Iterator[None]:
        """Say, while the block runs, that the model at path is being checked and loaded."""
        with self._switch:
            self.loading_model = path
        try:
            yield
        finally:
            with self._switch:
                self.loading_model = None
                self._switch.notify_all()  # turns that waited: on whichever model serves

    def replace_engine(self, load: Callable[[], tuple[Engine, KVCache]]) -> None:
        """Switch to the engine load() builds, as one step: the turns under way are stopped
        (each keeps what it wrote), new turns and those waiting for a slot wait for the new
        model. If it fails to load, the current one serves on and the error propagates."""
        with self._switch:
            while self._loading:  # one switch at a time
                self._switch.wait()
            self._loading = True
        old = self.runtime
        try:
            if old is not None:
                old.retire()  # its files complete before a new store reads them
            try:
                engine, cache = load()
            except BaseException:
                if old is not None:
                    self.runtime = old.reopened()
                raise
            self.runtime = ModelRuntime(engine, cache, self.limits)
            self.load_error = None
        finally:
            with self._switch:
                self._loading = False
                self._switch.notify_all()
        if old is not None:
            old.close()
        log.info("now serving %s", engine.name)
        self.share_default_prompt(self.runtime)  # not using_model: its switch is not over

    def set_defaults(self, defaults: ChatSettings) -> None:
        """New chats' settings from now on (a settings change)."""
        self.defaults = defaults
        self.share_default_prompt()

    def share_default_prompt(self, runtime: ModelRuntime | None = None) -> None:
        """Put the default system prompt's opening on disk for every user (KVCache.share),
        with runtime (the current one by default)."""
        runtime = runtime or self.runtime
        if runtime is None or not runtime.cache.enabled:
            return
        try:
            with runtime.lease():
                opening = runtime.prompts.fixed_head(self.defaults.system_prompt, [], SHARED)

                def share() -> Iterator[None]:
                    runtime.cache.share(opening)
                    yield

                runtime.scheduler.run(share, scope=SHARED)
        except Replaced:  # switched meanwhile: the next switch shares it for its model
            return

    def close(self) -> None:
        """Stop the turns under way (each keeps what it wrote) and the engine's thread, and
        write the KV files; the engine stays open."""
        if self.runtime is not None:
            self.runtime.scheduler.stop(cancel=True)
            self.runtime.cache.flush()

    def stop_turn(self, chat_id: int, user: str | None = None) -> bool:
        """Stop the chat's reply being written or waiting (the page's Stop), from any thread:
        it keeps what it wrote, and its slot is free within one decode. False if none."""
        self.get_chat(chat_id, user)
        runtime = self.runtime
        return runtime is not None and runtime.scheduler.cancel_chat(chat_id) > 0

    def writing(self, user: str | None = None) -> set[int]:
        """The user's chats with a reply being written or waiting for a slot."""
        runtime = self.runtime
        if runtime is None:
            return set()
        mine = set()
        for chat_id in runtime.scheduler.writing():
            try:
                self.get_chat(chat_id, user)
            except ChatNotFound:
                continue
            mine.add(chat_id)
        return mine

    # chats
    #
    # Every method that takes a chat id takes the user asking (None without accounts): a chat
    # of another user is answered as if it did not exist (ChatNotFound).

    def new_chat(self, title: str = "", system_prompt: str | None = None, *,
                 user: str | None = None) -> Chat:
        """A chat with the server's default settings (and system_prompt, if given)."""
        title = checked_title(title) or DEFAULT_TITLE
        settings = self.defaults.changed(system_prompt=system_prompt)
        with self._room_for_a_chat(user):
            return self.store.create_chat(title=title, owner=user, **settings.as_dict())

    def empty_chat(self, user: str | None = None) -> Chat:
        """The page's "New chat": the user's newest chat if it is still empty and untitled,
        else a new one (pressing it twice does not make two empty chats)."""
        newest = self.store.newest_chat(user)
        if (newest is not None and newest.leaf_id is None and newest.title == DEFAULT_TITLE
                and ChatSettings.of(newest) == self.defaults):
            return newest
        return self.new_chat(user=user)

    @contextmanager
    def _room_for_a_chat(self, user: str | None, count: int = 1) -> Iterator[None]:
        """Create count chats in the block, unless the user would have more than max_chats
        (TooManyChats). The room is reserved under a short lock, and the chats made outside
        it: a long import makes nobody else wait (nor the same user's "New chat")."""
        with self._creating:
            if (self.store.count_chats(user) + self._reserved.get(user, 0) + count
                    > self.max_chats):
                raise TooManyChats(
                    f"you have {self.max_chats:,} chats, the most this server keeps for one "
                    f"user: delete some to start a new one" if count == 1 else
                    f"this would make more than {self.max_chats:,} chats, the most this "
                    f"server keeps for one user")
            self._reserved[user] = self._reserved.get(user, 0) + count
        try:
            yield
        finally:
            with self._creating:
                self._reserved[user] -= count
                if not self._reserved[user]:
                    del self._reserved[user]

    def list_chats(self, user: str | None = None, limit: int | None = None) -> list[Chat]:
        return self.store.list_chats(owner=user, limit=limit)

    def count_chats(self, user: str | None = None) -> int:
        return self.store.count_chats(user)

    def latest_chat(self, user: str | None = None) -> Chat | None:
        """The user's most recently active chat, pinned or not: the one a page opens on."""
        return self.store.newest_chat(user, active=True)

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

    def thread(self, chat_id: int, user: str | None = None) -> tuple[Chat, Thread]:
        """A chat and all its messages, every version (the branch shown: thread.branch)."""
        chat = self.get_chat(chat_id, user)
        return chat, self.store.thread(chat_id)

    def show_version(self, chat_id: int, message_id: int,
                     user: str | None = None) -> list[Message]:
        """Show another version of a message (an edit or a retry kept beside it) and the
        newest messages after it; the branch now shown."""
        chat = self.get_chat(chat_id, user)
        try:
            branch = self.store.show_version(chat_id, message_id)
        except MessageNotFound as exc:
            raise ChatError(str(exc)) from None
        shown = next(m for m in branch if m.id == message_id)
        if shown.position < chat.window_start:  # a branch the window was not made for
            self.store.update_chat(chat_id, window_start=0)
        return branch

    def branch(self, chat_id: int, message_id: int, user: str | None = None) -> Chat:
        """A new chat holding this chat's history up to message_id (any of its messages):
        "Branch from here". Its first turn restores the KV they share from this chat's file."""
        chat, thread = self.thread(chat_id, user)
        if message_id not in thread.by_id:
            raise ChatError(f"message {message_id} is not in chat {chat_id}")
        history = thread.branch_to(message_id)
        with self._room_for_a_chat(user):
            copy = self.store.create_chat(
                title=checked_title(f"{chat.title} (branch)"), owner=user,
                branched_from=chat.id, **ChatSettings.of(chat).as_dict())
        self.store.copy_messages(copy.id, history)
        if chat.window_start <= history[-1].position:
            copy = self.store.update_chat(copy.id, window_start=chat.window_start)
        return copy

    def export_file(self, chat_id: int | None, user: str | None = None, *,
                    markdown: bool = False) -> dict[str, str]:
        """A chat (None: all the user's chats) as a file to save: {"name", "type", "text"};
        JSON in Reame's documented format (transfer.py), or the branch shown as Markdown."""
        if chat_id is None:
            chats = [self.thread(chat.id, user) for chat in self.list_chats(user)]
            return {"name": "reame-chats.json", "type": "application/json",
                    "text": json.dumps(export_all(chats), ensure_ascii=False, indent=1)}
        chat, thread = self.thread(chat_id, user)
        name = re.sub(r"[^\w-]+", "-", chat.title).strip("-")[:60] or "chat"
        if markdown:
            return {"name": f"{name}.md", "type": "text/markdown",
                    "text": to_markdown(chat, thread)}
        return {"name": f"{name}.json", "type": "application/json",
                "text": json.dumps(export_chat(chat, thread), ensure_ascii=False, indent=1)}

    def import_chats(self, data: bytes | str, user: str | None = None) -> list[Chat]:
        """Chats from an export: Reame's JSON (one chat or all) or ChatGPT's
        conversations.json. All or nothing is checked before anything is stored (BadImport,
        TooManyChats); their KV is built on their first turn. The chats made, newest first."""
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadImport(f"the file is not JSON ({exc})") from None
        except RecursionError:
            raise BadImport("the file's JSON is nested too deeply") from None
        where = lone_surrogate(parsed)
        if where is not None:
            raise BadImport(f"{where} is not valid text (it holds a lone UTF-16 surrogate)")
        imported = parse_import(parsed)
        settings = [chat.settings_over(self.defaults) for chat in imported]
        made = []
        with self._room_for_a_chat(user, len(imported)):
            try:
                for chat, chosen in zip(imported, settings):
                    made.append(self.store.create_chat(title=chat.title, owner=user,
                                                       **chosen.as_dict()))
                    self.store.add_tree(made[-1].id, chat.messages, chat.current)
            except BaseException:  # all or nothing: the chats made so far go again
                for chat in made:
                    self.store.delete_chat(chat.id)
                raise
        return [self.get_chat(chat.id, user) for chat in reversed(made)]

    def search(self, words: str, user: str | None = None) -> list[Found]:
        """The user's chats whose title or messages hold every word (Store.search)."""
        return self.store.search(user, words)

    def toggle_pin(self, chat_id: int, user: str | None = None) -> Chat:
        """Pin the chat to the top of the list, or unpin it."""
        chat = self.get_chat(chat_id, user)
        return self.store.update_chat(chat_id, pinned=not chat.pinned)

    def rename_chat(self, chat_id: int, title: str, user: str | None = None) -> Chat:
        self.get_chat(chat_id, user)
        title = checked_title(title)
        if not title:
            raise ChatError("a chat title cannot be empty")
        return self.store.update_chat(chat_id, title=title)

    def update_settings(self, chat_id: int, *, user: str | None = None,
                        **changes: Any) -> Chat:
        """Change a chat's own settings (chat_settings.FIELDS); None keeps a value."""
        settings = ChatSettings.of(self.get_chat(chat_id, user)).changed(**changes)
        # Only the changed ones: two changes at once (the page's fields) must not undo another.
        return self.store.update_chat(chat_id, **{name: getattr(settings, name)
                                                  for name, value in changes.items()
                                                  if value is not None})

    def delete_chat(self, chat_id: int, user: str | None = None) -> None:
        self.get_chat(chat_id, user)
        self.store.delete_chat(chat_id)
        if self.cache:
            self.cache.forget(chat_id)

    def warm(self, chat_id: int, user: str | None = None) -> bool:
        """Restore the chat's KV from disk ahead of its next turn (called when a chat is
        opened), unless the engine stays busy. True if something was restored."""
        runtime = self.runtime
        if runtime is None or self.loading or not runtime.cache.enabled:
            return False
        chat = self.get_chat(chat_id, user)
        scope = _scope(chat)
        if not runtime.cache.has_file(chat_id):
            return False  # nothing to restore: no slot given up for it
        started, restored = runtime.scheduler.try_run(
            lambda: self._warm_steps(runtime, chat_id, scope), chat_id=chat_id, scope=scope)
        return bool(started and restored)

    def type_ahead(self, chat_id: int, draft: str, user: str | None = None) -> int:
        """Evaluate the prompt a send of the message being typed would make, by the very
        decodes the send makes: sent as it stands, its reply starts from these logits; typed
        on, only its last chunk and what follows are evaluated again. Never waits: when a turn
        (or another draft) holds the model, nothing is done. The tokens evaluated."""
        runtime = self.runtime
        if runtime is None or self.loading or not draft.strip():
            return 0
        chat = self.get_chat(chat_id, user)
        try:
            with runtime.lease():
                if runtime.scheduler.busy:
                    return 0
                try:
                    window = fit(runtime.prompts, chat, _scope(chat),
                                 self.store.messages(chat.id), Turn("user", draft), None)
                except MessageTooLong:
                    return 0
        except Replaced:
            return 0
        if window.dropped_now:
            return 0  # the turn will move the window: leave it to the turn
        job, runner = self._job(chat, window, None), self._runner(runtime)

        def type_ahead() -> Iterator[int | None]:
            if runtime.engine.ready_for(job.prompt):
                return  # done already
            stats = TurnStats()
            restored = yield from runner.prefill_steps(job, stats)
            runtime.cache.typed(chat.id, restored, len(job.prompt))
            yield stats.prefilled

        _, prefilled = runtime.scheduler.try_run(type_ahead, chat_id=chat.id,
                                                 scope=job.scope, background=True)
        return prefilled or 0

    def cache_stats(self, user: str | None = None, *, whole_server: bool = True) -> dict:
        """The KV cache's figures: the whole server's and its files (for an administrator),
        or only those of user's own turns."""
        if not self.cache:
            return {"enabled": False}
        stats = self.cache.stats(None if whole_server else user_scope(user))
        chats = self.store.chat_ids() if whole_server else {
            chat.id for chat in self.store.list_chats(user)}
        stats["chats_ready"] = self.cache.chats_ready(chats)
        return stats

    # turns

    def send(self, chat_id: int, text: str, *, seed: int | None = None,
             user: str | None = None, max_tokens: int | None = None,
             stop: tuple[str, ...] = ()) -> TurnStream:
        """Add the user's message and stream the reply. The reply is saved even when stopped.
        max_tokens and stop, when given, apply to this reply only (the OpenAI route)."""
        check_text(text)
        check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(text)
        return TurnStream(lambda stream: self._turn(
            stream, chat, text, seed=seed, max_tokens=max_tokens, stop=stop))

    def regenerate(self, chat_id: int, *, seed: int | None = None,
                   user: str | None = None) -> TurnStream:
        """Replace the last reply with a new one; the history's KV is reused up to it."""
        check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        messages = self.store.messages(chat_id)
        if not messages:
            raise ChatError("there is no reply to regenerate: the chat is empty")
        kept = kept_on_regenerate(messages)
        cut_at = messages[len(kept)].position if len(kept) < len(messages) else None
        return TurnStream(lambda stream: self._turn(stream, chat, None, seed=seed,
                                                    cut_at=cut_at))

    def edit_message(self, chat_id: int, message_id: int, text: str, *,
                     seed: int | None = None, user: str | None = None) -> TurnStream:
        """Replace one of the user's messages (and drop what followed it), then answer it."""
        check_text(text)
        check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(text)
        target = next((m for m in self.store.messages(chat_id) if m.id == message_id), None)
        if target is None:
            raise ChatError(f"message {message_id} is not in chat {chat_id}")
        if target.role != "user":
            raise ChatError("only the user's messages can be edited")
        return TurnStream(lambda stream: self._turn(stream, chat, text, cut_at=target.position,
                                                    seed=seed))

    def check_message(self, text: str) -> None:
        """Refuse what send() would refuse before anything changes: an empty message, or no
        model (unless one is loading: the turn waits for it)."""
        check_text(text)
        if self.engine is None and not self.loading:
            raise NoModel(self.load_error or "no model is loaded")

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

    def _turn(self, stream: TurnStream, chat: Chat, text: str | None, *,
              cut_at: int | None = None, seed: int | None, max_tokens: int | None = None,
              stop: tuple[str, ...] = ()) -> Iterator[TurnUpdate]:
        scope = _scope(chat)
        while True:  # until a slot of the current model's (a switch sends turns on)
            runtime = self._current()
            try:
                place = runtime.scheduler.reserve(  # or ServerBusy, before anything changes
                    chat_id=chat.id, scope=scope, owner=chat.owner,
                    prelude=self._restore_ahead(runtime, chat.id, scope))
            except Replaced:
                continue
            stream.bind(runtime.scheduler, place)
            try:
                # The chat's turn before this one has kept its reply once this one has a
                # slot: the history is read after that.
                for waiting in runtime.scheduler.wait_for_slot(place):
                    yield TurnUpdate("", queued=waiting.position, chat_id=chat.id)
                with runtime.lease():
                    job, keeper = self._prepare_turn(runtime, chat.id, chat.owner, text,
                                                     cut_at, seed, max_tokens, stop)
            except Replaced:
                continue
            except Stopped:  # before its slot: nothing was stored
                return
            except BaseException:
                runtime.scheduler.cancel(place)
                raise
            break
        runner = self._runner(runtime)
        yield from self._updates(runtime.scheduler.results(place, lambda: runner.run(
            job, keeper)), job)

    def _prepare_turn(self, runtime: ModelRuntime, chat_id: int, owner: str | None,
                      text: str | None, cut_at: int | None, seed: int | None,
                      max_tokens: int | None, stop: tuple[str, ...]) -> tuple[Job, ChatKeeper]:
        """Store the user's message and make the turn's job (its slot is held meanwhile)."""
        chat = self.get_chat(chat_id, owner)  # as the chat's last turn left it
        history = self.store.messages(chat.id)
        kept = [m for m in history if cut_at is None or m.position < cut_at]
        window = fit(runtime.prompts, chat, _scope(chat), kept,
                     Turn("user", text) if text is not None else None, cut_at)
        # Each write checks, in its own transaction, that the chat is still the owner's.
        if cut_at is not None:  # a new version: the old one stays (versions)
            self.store.rewind(chat.id, cut_at, expect_owner=owner)
        if window.start != chat.window_start:
            chat = self.store.update_chat(chat.id, window_start=window.start,
                                          expect_owner=owner)
        user_message_id = None
        if text is not None:
            user_message_id = self.store.add_message(chat.id, "user", text,
                                                     expect_owner=owner).id
            if chat.title == DEFAULT_TITLE and not kept:
                self.store.update_chat(chat.id, title=title_from(text), expect_owner=owner)
        after = user_message_id if text is not None else (kept[-1].id if kept else None)
        job = self._job(chat, window, seed, max_tokens=max_tokens, stop=stop,
                        user_message_id=user_message_id)
        return job, ChatKeeper(self.store, chat.id, chat.owner, runtime.engine.fingerprint,
                               after)

    def _restore_ahead(self, runtime: ModelRuntime, chat_id: int,
                       scope: str) -> Callable[[], Iterator[bool]] | None:
        """What the turn's slot does while this thread reads the database and tokenizes the
        prompt: restore the chat's KV file (as when a chat is opened), if it has one."""
        if not runtime.cache.has_file(chat_id):
            return None
        return lambda: self._warm_steps(runtime, chat_id, scope)

    @staticmethod
    def _warm_steps(runtime: ModelRuntime, chat_id: int, scope: str) -> Iterator[bool]:
        try:
            yield runtime.cache.warm(chat_id, scope) is not None
        except Exception:  # a failed restore is a miss: the turn looks up again
            log.exception("restoring chat %d's KV ahead of its turn failed", chat_id)
            yield False

    @staticmethod
    def _updates(results: Iterator[object], job: Job) -> Iterator[TurnUpdate]:
        """A turn's updates; while it waits for a slot, its place in line."""
        for item in results:
            if isinstance(item, Waiting):
                yield TurnUpdate("", queued=item.position, chat_id=job.chat_id,
                                 user_message_id=job.user_message_id)
            else:
                yield item

    def _job(self, chat: Chat, window: Window, seed: int | None, *,
             max_tokens: int | None = None, stop: tuple[str, ...] = (),
             user_message_id: int | None = None) -> Job:
        return Job(window.prompt, window.turns, chat.system_prompt, _scope(chat),
                   Sampling(temperature=chat.temperature, top_p=chat.top_p, seed=seed),
                   max_tokens or chat.max_tokens, stop, chat_id=chat.id,
                   user_message_id=user_message_id, drop=window.drop, outside=window.outside,
                   # The default system prompt's opening is the administrator's: every user's.
                   shared_opening=chat.system_prompt == self.defaults.system_prompt,
                   branched_from=chat.branched_from)

    def _runner(self, runtime: ModelRuntime) -> TurnRunner:
        return TurnRunner(runtime.engine, runtime.cache, runtime.prompts, self.observe_turn)

    # stateless completions (the OpenAI route): nothing stored, the KV cache still used

    def complete(self, system_prompt: str, turns: list[Turn], *, max_tokens: int | None = None,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 stop: tuple[str, ...] = (), logit_bias: tuple[tuple[int, float], ...] = (),
                 user: str | None = None) -> TurnStream:
        """Answer a whole conversation sent at once. Its KV is found by its tokens (the
        cache's block-hash index, within user's scope), so a conversation resent with one
        more message evaluates only that message. Refusals (no model, too long) raise before
        the first update."""
        if self.runtime is None:
            raise NoModel(self.load_error or "no model is loaded")
        check_seed(seed)
        self._check_length(system_prompt, *(t.content for t in turns))
        with self.using_model() as runtime:
            n_vocab = runtime.engine.n_vocab
        for token, _ in logit_bias:
            if not 0 <= token < n_vocab:
                raise ChatError(f"logit_bias: token {token} is not in the model's vocabulary "
                                f"(0 to {n_vocab - 1})")
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed,
                            logit_bias=logit_bias)
        return TurnStream(lambda stream: self._complete(
            stream, system_prompt, turns, sampling, max_tokens, stop, user))

    def _complete(self, stream: TurnStream, system_prompt: str, sent: list[Turn],
                  sampling: Sampling, max_tokens: int | None, stop: tuple[str, ...],
                  user: str | None) -> Iterator[TurnUpdate]:
        scope = user_scope(user)
        while True:  # until a slot of the current model's (a switch sends requests on)
            with self.using_model() as runtime:  # tokenized with the model that answers
                turns, prompt = self.replies.tokenize(runtime.prompts, system_prompt, sent,
                                                      scope)
            job = Job(prompt, turns, system_prompt, scope, sampling,
                      max_tokens or self.defaults.max_tokens, stop,
                      shared_opening=system_prompt == self.defaults.system_prompt)
            keeper = ConversationKeeper(self.replies, runtime.engine.fingerprint, scope)
            runner = self._runner(runtime)
            try:
                place = runtime.scheduler.reserve(scope=scope, prompt=prompt, owner=user)
            except Replaced:
                continue
            stream.bind(runtime.scheduler, place)
            started = False  # past its place in line
            try:
                for update in self._updates(runtime.scheduler.results(
                        place, lambda: runner.run(job, keeper)), job):
                    started = started or not update.queued
                    yield update
            except Replaced:  # the switch came before its slot: nothing was done
                continue
            if not started and runtime.retired and not stream.cancelled:
                continue  # stopped by a switch before its first token: the new model answers
            return


def kept_on_regenerate(messages: list[Message]) -> list[Message]:
    """The messages a regenerate keeps: all but the last reply, which it replaces."""
    return messages[:-1] if messages and messages[-1].role == "assistant" else messages


def _scope(chat: Chat) -> str:
    """The cache scope of a chat's turns: its owner's."""
    return user_scope(chat.owner)
