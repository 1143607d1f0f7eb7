"""Turns: a stored chat's message, regenerate and edit (stateless_turns.py: the OpenAI
routes' turns); restoring a chat's KV ahead of its turn (restore_ahead) and evaluating its
message while it is typed (type_ahead). Each is a Job for the TurnRunner, run on the engine's
thread (scheduler.py), the reply kept by its Keeper."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TypeVar

from reame.chats.chat_keeper import ChatKeeper
from reame.chats.messages import ChatMessage, ChatTree, Role
from reame.chats.store import Chat, Message
from reame.chats.titles import DEFAULT_TITLE, title_from
from reame.chats.tool_calls import ToolOffer, result_messages
from reame.chats.window import Window, fit
from reame.config.refusals import (
    ChatError,
    ChatNotFound,
    MessageTooLong,
    NoModel,
    check_seed,
    check_text,
)
from reame.inference.model_runtime import ModelRuntime
from reame.inference.prompt import PromptMessage
from reame.inference.sampling import Sampling
from reame.inference.scope import Scope, user_scope
from reame.inference.tasks import Replaced, Stopped, Waiting
from reame.inference.turn import Job, TurnUpdate
from reame.inference.tools import repeated_call
from reame.inference.turn_stream import TurnStream

log = logging.getLogger(__name__)
M = TypeVar("M", Message, ChatMessage)


class Turns:
    """ChatService's turns (a mixin: the state is ChatService.__init__'s)."""

    def restore_ahead(self, chat_id: int, user: str | None = None) -> bool:
        """Restore the chat's KV from disk ahead of its next turn (called when a chat is
        opened), unless the engine stays busy. True if something was restored."""
        runtime = self.runtime
        if runtime is None or self.loading or not runtime.cache.enabled:
            return False
        chat = self._chat(chat_id, user)
        return runtime.restore_ahead(chat_id, chat_scope(chat))

    def type_ahead(self, chat_id: int, draft: str, user: str | None = None) -> int:
        """Evaluate the prompt a send of the message being typed would make, by the very
        decodes the send makes: sent as it stands, its reply starts from these logits; typed
        on, only its last chunk and what follows are evaluated again. Never waits: when a turn
        (or another draft) holds the model, nothing is done. The tokens evaluated."""
        runtime = self.runtime
        if runtime is None or self.loading or not draft.strip():
            return 0
        chat = self._chat(chat_id, user)
        try:
            with runtime.lease():
                if runtime.scheduler.busy:
                    return 0
                try:
                    window = fit(runtime.prompts, chat, chat_scope(chat),
                                 self.store.messages(chat.id),
                                 [PromptMessage(Role.USER, draft)], None)
                except MessageTooLong:
                    return 0
        except Replaced:
            return 0
        if window.dropped_now:
            return 0  # the turn will move the window: leave it to the turn
        return runtime.type_ahead(self._job(chat, window, None))

    def document_tokens(self, text: str) -> int | None:
        """The tokens a document's text takes in a prompt (None: no model to count them), or
        MessageTooLong if it cannot fit in the model's context with room for a reply."""
        runtime = self.runtime
        if runtime is None or self.loading:
            return None
        self._check_length(text)
        n_ctx = runtime.engine.n_ctx
        count = len(runtime.engine.tokenize(text, special=False))
        if count > n_ctx * 3 // 4:
            raise MessageTooLong(
                f"it is {count:,} tokens: more than this model's context of {n_ctx:,} tokens "
                "holds with room for a question and a reply")
        return count

    # turns

    def send(self, chat_id: int, text: str, *, seed: int | None = None,
             user: str | None = None, max_tokens: int | None = None,
             stop: tuple[str, ...] = (), arrived: float | None = None,
             seen: Callable[[], float | None] | None = None,
             offer: ToolOffer | None = None) -> TurnStream:
        """Add the user's message and stream the reply. The reply is saved even when stopped.
        max_tokens and stop, when given, apply to this reply only (the OpenAI route).
        arrived: when the message reached the server (time.perf_counter(); default: now),
        for the stats' waited_s; seen: the person's own wait to the first words, once their
        browser has said it (None until then), which waited_s is at least. offer: the tools
        the reply may call (tool_calls.py): its calls are kept with it."""
        check_text(text)
        check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(text)
        arrived = arrived if arrived is not None else time.perf_counter()
        return TurnStream(lambda stream: self._turn(
            stream, chat, text, seed=seed, max_tokens=max_tokens, stop=stop, arrived=arrived,
            seen=seen, offer=offer))

    def send_results(self, chat_id: int, results: list[tuple[str, str]], *,
                     seed: int | None = None, user: str | None = None,
                     max_tokens: int | None = None, stop: tuple[str, ...] = (),
                     offer: ToolOffer | None = None) -> TurnStream:
        """Add the results of the tools the chat's last reply called ((call id, content)
        each, every call answered) and stream the reply to them, as send() does a message."""
        check_seed(seed)
        chat = self._chat_for_turn(chat_id, user)
        self._check_length(*(content for _, content in results))
        branch = self.store.messages(chat.id)
        last = branch[-1] if branch and branch[-1].role == Role.ASSISTANT else None
        added = result_messages(last.call_list if last is not None else None, results)
        arrived = time.perf_counter()
        return TurnStream(lambda stream: self._turn(
            stream, chat, None, seed=seed, max_tokens=max_tokens, stop=stop, arrived=arrived,
            offer=offer, results=added))

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
        arrived = time.perf_counter()
        return TurnStream(lambda stream: self._turn(stream, chat, None, seed=seed,
                                                    cut_at=cut_at, arrived=arrived))

    def continue_reply(self, chat_id: int, *, user: str | None = None) -> TurnStream:
        """The last reply goes on where it stopped (cut at Max tokens, or stopped): the prompt
        ends inside it, so its KV is reused whole, and what follows is kept with it as a new
        version of it (the cut one stays). Its updates hold the whole reply so far."""
        chat = self._chat_for_turn(chat_id, user)
        messages = self.store.messages(chat_id)
        if not messages or messages[-1].role != Role.ASSISTANT:
            raise ChatError("there is no reply to continue: the chat's last message is not a "
                            "reply")
        if messages[-1].tool_calls:  # its calls wait for their results, not for more words
            raise ChatError("a reply that called tools is not continued: send the tools' "
                            "results (or a message) instead")
        arrived = time.perf_counter()
        return TurnStream(lambda stream: self._turn(stream, chat, None, seed=None,
                                                    continued=messages[-1], arrived=arrived))

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
        if target.role != Role.USER:
            raise ChatError("only the user's messages can be edited")
        arrived = time.perf_counter()
        return TurnStream(lambda stream: self._turn(stream, chat, text, cut_at=target.position,
                                                    seed=seed, arrived=arrived))

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
        chat = self._chat(chat_id, user)
        if self.engine is None:
            raise NoModel(self.load_error or "no model is loaded")
        return chat

    def _turn(self, stream: TurnStream, chat: Chat, text: str | None, *,
              cut_at: int | None = None, seed: int | None, max_tokens: int | None = None,
              stop: tuple[str, ...] = (), continued: Message | None = None,
              arrived: float | None = None,
              seen: Callable[[], float | None] | None = None, offer: ToolOffer | None = None,
              results: list[dict] | None = None) -> Iterator[TurnUpdate]:
        scope = chat_scope(chat)
        while True:  # until a slot of the current model's (a switch sends turns on)
            runtime = self._current()
            try:
                place = runtime.scheduler.reserve(  # or ServerBusy, before anything changes
                    chat_id=chat.id, scope=scope, owner=chat.owner,
                    prelude=runtime.restore_ahead_prelude(chat.id, scope))
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
                                                     cut_at, seed, max_tokens, stop, continued,
                                                     offer, results)
            except Replaced:
                continue
            except Stopped:  # before its slot: the message is kept all the same, unanswered
                self._keep_unanswered(runtime, chat, text, results)
                return
            except BaseException:
                runtime.scheduler.cancel(place)
                raise
            break
        job = replace(job, arrived=arrived, seen=seen)
        before = continued.content if continued is not None else ""
        results = runtime.run_turn(place, job, keeper, self.observe_turn)
        try:
            for update in self._updates(results, job):
                if before and not update.queued and update.reading is None:  # the reply so far
                    update = replace(update, text=keeper.text if update.done and keeper.kept
                                     else before + update.text)
                if update.done:  # the chat as the faces see it, once the reply is kept
                    update.kept = ChatTree.of(keeper.kept) if keeper.kept is not None else None
                    if keeper.kept is not None and keeper.first_title:
                        self.titles.after_first_reply(chat.id, chat.owner, keeper.first_title,
                                                      text or "", keeper.text)
                yield update
                keeper.shown(update)  # passed on: the reply so far may be written
        finally:
            results.close()  # waits for the turn's end: its reply kept, or none
            keeper.unmade()

    def _keep_unanswered(self, runtime: ModelRuntime, chat: Chat, text: str | None,
                         results: list[dict] | None = None) -> None:
        """A message stopped while its turn waited for a slot is stored without a reply, as a
        Stop once its reply began keeps it: the person's text (or a tool's results) is never
        lost to a Stop."""
        if text is None and not results:
            return
        try:
            with runtime.lease():
                self._prepare_turn(runtime, chat.id, chat.owner, text, None, None, None, (),
                                   results=results)
        except (Replaced, ChatError, ChatNotFound):  # a new model, or the chat gone meanwhile
            log.info("a message stopped before its turn began was not kept in chat %d", chat.id)

    def _prepare_turn(self, runtime: ModelRuntime, chat_id: int, owner: str | None,
                      text: str | None, cut_at: int | None, seed: int | None,
                      max_tokens: int | None, stop: tuple[str, ...],
                      continued: Message | None = None, offer: ToolOffer | None = None,
                      results: list[dict] | None = None) -> tuple[Job, ChatKeeper]:
        """Store the user's message and make the turn's job (its slot is held meanwhile).

        A turn writes, each time one transaction: here, before its reply (the user's message,
        the rewind of an edit or a regenerate, the window moved, the title of a first
        message); its reply's row as it streams (ChatKeeper.shown: a crash loses at most a
        second of it); and when its reply ends (ChatKeeper.keep: the reply, its stats, the
        chat's leaf and updated time). The first write is not kept for the end: a reload while
        the reply is written shows the message, and a reply stopped, or failed, keeps it."""
        chat = self._chat(chat_id, owner)  # as the chat's last turn left it
        tree = self.store.tree(chat.id)
        history = tree.branch
        if continued is not None and (not history or history[-1].id != continued.id):
            raise ChatError("the reply to continue is no longer the chat's last message")
        kept = [m for m in history if cut_at is None or m.position < cut_at]
        if results:  # as the chat stands now, its turns before this one ended
            last = kept[-1] if kept and kept[-1].role == Role.ASSISTANT else None
            result_messages(last.call_list if last is not None else None,
                            [(r["tool_call_id"], r["content"]) for r in results])
        new = ([PromptMessage(Role.USER, text)] if text is not None else
               [PromptMessage(Role.TOOL, r["content"]) for r in results or ()])
        window = fit(runtime.prompts, chat, chat_scope(chat), kept, new, cut_at,
                     offer.tools if offer is not None else ())
        changes: dict = {}
        if cut_at is not None:  # a new version: the old one stays (versions)
            changes["leaf_id"] = kept[-1].id if kept else None
        if window.start != chat.window_start:
            changes["window_start"] = window.start
        if text is not None and chat.title == DEFAULT_TITLE and not kept:
            changes["title"] = title_from(text)
        message = [dict(role=Role.USER, content=text)] if text is not None else results
        user_message_id, messages = None, tree.messages
        if changes or message:
            # The write checks, in its transaction, that the chat is still the owner's.
            written, added = self.store.write_turn(chat.id, expect_owner=owner,
                                                   message=message or None, **changes)
            chat = written if "window_start" in changes else chat
            if added:
                user_message_id, messages = added[-1].id, messages + added
        after = user_message_id if message else (kept[-1].id if kept else None)
        if continued is not None:
            after = continued.parent_id  # the continued reply's new version, beside it
        job = self._job(chat, window, seed, max_tokens=max_tokens, stop=stop,
                        user_message_id=user_message_id, offer=offer)
        retried = (history[-1].id if cut_at is not None and text is None and history
                   and history[-1].role == Role.ASSISTANT and continued is None else None)
        keeper = ChatKeeper(self.store, chat, messages, runtime.engine.fingerprint, after,
                            continued, replaced=retried,
                            id_prefix=offer.id_prefix if offer is not None else None)
        keeper.first_title = changes.get("title")  # a first message: the model may do better
        return job, keeper

    @staticmethod
    def _updates(results: Iterator[object], job: Job) -> Iterator[TurnUpdate]:
        """A turn's updates; while it waits for a slot, its place in line."""
        for item in results:
            if isinstance(item, Waiting):
                yield TurnUpdate("", queued=item.position, chat_id=job.chat_id,
                                 user_message_id=job.user_message_id,
                                 prompt_tokens=len(job.prompt))
            else:
                yield item

    def _job(self, chat: Chat, window: Window, seed: int | None, *,
             max_tokens: int | None = None, stop: tuple[str, ...] = (),
             user_message_id: int | None = None, offer: ToolOffer | None = None) -> Job:
        tools = offer.tools if offer is not None else ()
        return Job(window.prompt, window.turns, chat.system_prompt, chat_scope(chat),
                   Sampling(temperature=chat.temperature, top_p=chat.top_p, seed=seed,
                            grammar=offer.grammar if offer is not None else None,
                            grammar_trigger=offer.grammar_trigger if offer is not None else None),
                   max_tokens or chat.max_tokens, stop, chat_id=chat.id,
                   user_message_id=user_message_id, drop=window.drop, outside=window.outside,
                   # The default system prompt's opening is the administrator's: every user's
                   # (with tools, the opening is this request's).
                   shared_opening=chat.system_prompt == self.defaults.system_prompt and not tools,
                   branched_from=chat.branched_from, tools=tools,
                   ends=repeated_call if tools else None)


def kept_on_regenerate(messages: list[M]) -> list[M]:
    """The messages a regenerate keeps: all but the last reply, which it replaces (messages:
    the branch shown, as rows or as ChatMessage)."""
    return messages[:-1] if messages and messages[-1].role == Role.ASSISTANT else messages


def chat_scope(chat: Chat) -> Scope:
    """The cache scope of a chat's turns: its owner's."""
    return user_scope(chat.owner)
