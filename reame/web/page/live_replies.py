"""Replies the page keeps writing whoever watches them.

A turn started in the page runs as a task of the server's event loop, not inside the page
event that started it: switching chats, making a new one or reloading ends only the watching,
never the writing. The page follows the reply of the chat it shows (`follow`), from what it has
so far; Stop ends it (`stop`). Each reply remembers the tabs (Gradio sessions) that started or
followed it; a tab that closes lets go (`leave`), and a reply that no open tab watches any more
is stopped after `unwatched_s` seconds (the stall bound, [server] stalled_reply_s) unless a tab
follows it again meanwhile (a reload does). A stopped reply keeps what it has (turn_updates).

One reply per chat at a time; replies are keyed by (user, chat), so that a user only ever sees,
follows or stops their own. The page says which chat each tab shows (`showing`): a following
ends as soon as its tab shows another chat, so that a chunk of the chat left never reaches the
chat shown, however late the browser's cancel arrives.

So that the page reads a chat once per message sent, each tab's send leaves here the chat as
it drew it (`drew`: the reply's base), and the reply it started leaves the chat's messages as
it kept them (`ended`: what the page shows once the reply is over).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field

from reame.chats.messages import ChatTree
from reame.config.refusals import ChatError, ChatNotFound
from reame.inference.turn import TurnUpdate
from reame.inference.turn_stream import TurnStream
from reame.web.http.turn_updates import turn_updates

log = logging.getLogger(__name__)

STOP_WAIT_S = 30.0  # how long stop() waits for a stopped reply to be kept
EARLY_STOP_S = 10.0  # a Stop that came before its reply started still counts this long

Key = tuple[str | None, int]


@dataclass(eq=False)
class LiveReply:
    """One reply being written: what the chat shows under it (base: the messages as the page
    renders them, the new user message included) and its latest update."""

    user: str | None
    chat_id: int
    base: list[dict]
    latest: TurnUpdate | None = None
    error: BaseException | None = None
    tabs: set[str] = field(default_factory=set)
    ended: threading.Event = field(default_factory=threading.Event)
    task: asyncio.Task | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _unwatched: asyncio.TimerHandle | None = None

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class LiveReplies:
    def __init__(self, unwatched_s: float):
        self.unwatched_s = unwatched_s
        self._lock = threading.Lock()
        self._replies: dict[Key, LiveReply] = {}
        self._early_stops: dict[Key, float] = {}
        self._preparing: set[Key] = set()  # a retry, edit or Continue not yet started (expect)
        self._shown: dict[str, int | None] = {}  # tab -> the chat it shows
        self._ended: dict[str, LiveReply] = {}  # tab -> the reply it started that ended last
        self._drawn: dict[str, tuple[int, list[dict]]] = {}  # tab -> its send's base (drew)
        self._loop: asyncio.AbstractEventLoop | None = None

    # reading (any thread)

    def get(self, user: str | None, chat_id: int | None) -> LiveReply | None:
        with self._lock:
            return self._replies.get((user, chat_id))

    def chats_of(self, user: str | None) -> set[int]:
        """The user's chats whose reply is being written."""
        with self._lock:
            return {chat for owner, chat in self._replies if owner == user}

    def shows(self, tab: str, chat_id: int | None) -> bool:
        """Whether the tab shows the chat (as far as the page said; yes for a tab that has
        said nothing yet)."""
        with self._lock:
            return self._shown.get(tab, chat_id) == chat_id

    def showing(self, tab: str, chat_id: int | None) -> None:
        """The tab shows this chat from now on (drawn from the database: a reply it started
        that ended is no longer news, see ended)."""
        with self._lock:
            self._shown[tab] = chat_id
            self._ended.pop(tab, None)

    def drew(self, tab: str, chat_id: int, base: list[dict]) -> None:
        """The chat as the tab drew it for the message it sends (its reply's base, the message
        included), so that the reply starts from it without reading the chat again."""
        with self._lock:
            self._drawn[tab] = (chat_id, base)

    def drawn(self, tab: str, chat_id: int | None) -> list[dict] | None:
        """What the tab drew last for a message to chat_id (drew), once; None if nothing."""
        with self._lock:
            drawn = self._drawn.pop(tab, None)
        return drawn[1] if drawn is not None and drawn[0] == chat_id else None

    def ended(self, tab: str, user: str | None, chat_id: int | None) -> ChatTree | None:
        """The chat's messages (a ChatTree) as the user's reply in chat_id that tab started
        left them, if that reply is the tab's last, ended with its last update, and this was
        not asked since (the page shows them without reading them again); else None."""
        with self._lock:
            reply = self._ended.pop(tab, None)
        if reply is None or (reply.user, reply.chat_id) != (user, chat_id):
            return None
        return reply.latest.kept if reply.latest is not None and reply.latest.done else None

    # the event loop's side

    @contextmanager
    def expect(self, user: str | None, chat_id: int) -> Iterator[None]:
        """While a reply of the chat is being prepared (a retry, an edit or a Continue reads
        the chat before its reply starts): a Stop meanwhile is kept for it, as the page's Stop
        during a send is (stop's starting)."""
        key = (user, chat_id)
        with self._lock:
            self._preparing.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._preparing.discard(key)

    def start(self, user: str | None, chat_id: int, tab: str, base: list[dict],
              begin: Callable[[], TurnStream]) -> LiveReply | None:
        """Start writing a reply in the background (begin() makes the turn, in a worker
        thread: its refusals end up in reply.error). None if a Stop for this chat came just
        before (the page's Stop can overtake the start of its reply); a ChatError if the chat
        has a reply under way already."""
        key = (user, chat_id)
        with self._lock:
            self._ended.pop(tab, None)  # the tab's last reply, old news from now on
            self._preparing.discard(key)  # a Stop from now on finds the reply
            stopped_at = self._early_stops.pop(key, None)
            if stopped_at is not None and time.monotonic() - stopped_at < EARLY_STOP_S:
                return None
            if key in self._replies:
                raise ChatError("A reply is still being written in this chat: wait for it, "
                                "or press stop.")
            reply = self._replies[key] = LiveReply(user, chat_id, base, tabs={tab})
        self._loop = asyncio.get_running_loop()
        reply.task = asyncio.create_task(self._write(reply, begin, tab))
        return reply

    async def _write(self, reply: LiveReply, begin: Callable[[], TurnStream], tab: str) -> None:
        try:
            async with aclosing(turn_updates(begin)) as updates:
                async for update in updates:
                    reply.latest = update
                    reply._notify()
        except asyncio.CancelledError:
            pass  # stopped: turn_updates kept the reply so far
        except Exception as exc:  # a refusal (ChatError) or a failure: the page says it
            reply.error = exc
            if not _is_refusal(exc):
                log.exception("the reply in chat %s failed", reply.chat_id)
        finally:
            with self._lock:
                self._replies.pop((reply.user, reply.chat_id), None)
                if tab in self._shown or tab in reply.tabs:  # not closed meanwhile
                    self._ended[tab] = reply
            if reply._unwatched is not None:
                reply._unwatched.cancel()
            reply.ended.set()
            reply._notify()

    async def follow(self, user: str | None, chat_id: int | None,
                     tab: str) -> AsyncIterator[LiveReply]:
        """The chat's reply (the same object, its latest update changed) each time it has
        news, until it ends; nothing if none is being written. The tab watches it from now on.
        Raises the reply's refusal or failure at its end."""
        reply = self.get(user, chat_id)
        if reply is None or not self.shows(tab, chat_id):
            return
        self.watch(reply, tab)
        yield reply
        while not reply.ended.is_set():
            await reply._changed.wait()  # no await between the check and the wait
            if not self.shows(tab, chat_id):
                return  # the tab shows another chat now: the reply goes on unwatched by it
            yield reply
        if reply.error is not None:
            raise reply.error

    def watch(self, reply: LiveReply, tab: str) -> None:
        reply.tabs.add(tab)
        if reply._unwatched is not None:
            reply._unwatched.cancel()
            reply._unwatched = None

    def leave(self, tab: str) -> None:
        """A tab closed (Gradio's unload): its replies that no other tab watches are stopped
        after unwatched_s, unless one is followed again meanwhile. On the event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._shown.pop(tab, None)
            self._ended.pop(tab, None)
            self._drawn.pop(tab, None)
            replies = [r for r in self._replies.values() if tab in r.tabs]
        for reply in replies:
            reply.tabs.discard(tab)
            if not reply.tabs and reply._unwatched is None:
                reply._unwatched = loop.call_later(self.unwatched_s, self._if_unwatched, reply)

    def _if_unwatched(self, reply: LiveReply) -> None:
        reply._unwatched = None
        if not reply.tabs and reply.task is not None:
            log.info("stopping the reply in chat %s: no tab has watched it for %s s",
                     reply.chat_id, self.unwatched_s)
            reply.task.cancel()

    # stopping (any thread)

    def stop(self, user: str | None, chat_id: int | None, *, starting: bool = False) -> bool:
        """Stop the chat's reply and wait until it is kept (at most STOP_WAIT_S). starting:
        the page has sent a message whose reply may not have started yet (its event had not
        reached the server): with no reply under way, the Stop is kept for a reply of that
        chat that starts within EARLY_STOP_S; so it is while a retry, an edit or a Continue
        prepares one (expect). True if a reply was stopped."""
        if self._loop is not None and self._loop.is_running() and _on_loop(self._loop):
            raise RuntimeError("LiveReplies.stop waits: call it from a worker thread")
        key = (user, chat_id)
        with self._lock:
            reply = self._replies.get(key)
            if reply is None:
                now = time.monotonic()
                self._early_stops = {k: t for k, t in self._early_stops.items()
                                     if now - t < EARLY_STOP_S}
                if starting or key in self._preparing:
                    self._early_stops[key] = now
                return False
        if self._loop is not None and reply.task is not None:
            self._loop.call_soon_threadsafe(reply.task.cancel)
        return reply.ended.wait(STOP_WAIT_S)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, (ChatError, ChatNotFound))
