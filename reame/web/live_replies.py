"""The page's replies go on when you switch chats.

A reply started in the page is written by a thread of its own (a LiveReply), not by the event
that shows it: the page's events only follow it. Switching to another chat stops following,
not writing; coming back follows it again from where it is (the reply so far, then the rest).
Only Stop ends it (the chat's turn, ChatService.stop_turn), or the tab that started it being
closed (Gradio's unload: stop_session), or the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread

from ..turn import TurnUpdate
from ..turn_stream import TurnStream

log = logging.getLogger(__name__)

STOP_EARLY_S = 30.0  # a Stop this recent, before its reply started, still stops it


class LiveReply:
    """One reply being written, by its own thread; followers wait for its next update."""

    def __init__(self, chat_id: int, session: str | None, stream: TurnStream,
                 text: str | None = None):
        self.chat_id, self.session, self.stream = chat_id, session, stream
        self.text = text  # the user's message it answers (None: a regenerate)
        self._cond = threading.Condition()
        self.update: TurnUpdate | None = None
        self.version = 0  # updates so far
        self.done = False
        self.error: BaseException | None = None

    def write(self) -> None:
        """Drive the turn to its end (the writing thread)."""
        try:
            for update in self.stream:
                with self._cond:
                    self.update, self.version = update, self.version + 1
                    self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - a refusal (full, too long): the follower says it
            self.error = exc
        finally:
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def after(self, version: int) -> tuple[int, TurnUpdate | None, bool]:
        """Wait for an update past version, or the end: (version, update, done)."""
        with self._cond:
            while self.version == version and not self.done:
                self._cond.wait()
            return self.version, self.update, self.done

    def wait_done(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)


class LiveReplies:
    """The replies the page's users are having written, by chat."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_chat: dict[int, LiveReply] = {}
        self._stop_early: dict[int, float] = {}  # Stop before the reply started: when

    def stop(self, chat_id: int) -> None:
        """Stop the chat's reply: now if it is being written, else as soon as it starts (a
        Stop pressed right after Enter may come before the reply's event)."""
        with self._lock:
            live = self._by_chat.get(chat_id)
            if live is None:
                self._stop_early[chat_id] = time.monotonic()
        if live is not None:
            live.stream.cancel()

    def stopped_early(self, chat_id: int) -> bool:
        """Whether Stop was pressed for the chat's reply before it started (in the last
        STOP_EARLY_S); it is then not started."""
        with self._lock:
            at = self._stop_early.pop(chat_id, None)
        return at is not None and time.monotonic() - at < STOP_EARLY_S

    def start(self, chat_id: int, session: str | None, make: Callable[[], TurnStream],
              text: str | None = None) -> LiveReply:
        """Start writing the reply make() streams (refusals before any change raise here)."""
        live = LiveReply(chat_id, session, make(), text)
        with self._lock:
            self._by_chat[chat_id] = live
        threading.Thread(target=self._write, args=(live,), name=f"reply-{chat_id}",
                         daemon=True).start()
        return live

    def _write(self, live: LiveReply) -> None:
        live.write()
        with self._lock:
            if self._by_chat.get(live.chat_id) is live:
                del self._by_chat[live.chat_id]

    def of(self, chat_id: int | None) -> LiveReply | None:
        """The reply being written in the chat, if any."""
        with self._lock:
            return self._by_chat.get(chat_id) if chat_id is not None else None

    def chats(self) -> set[int]:
        with self._lock:
            return set(self._by_chat)

    def stop_session(self, session: str | None) -> None:
        """The tab that started these replies was closed: stop them."""
        with self._lock:
            gone = [live for live in self._by_chat.values() if live.session == session]
        for live in gone:
            log.info("chat %d: its tab was closed, its reply is stopped", live.chat_id)
            live.stream.cancel()


async def follow(live: LiveReply) -> AsyncIterator[TurnUpdate]:
    """The live reply's updates from where it is now to its end (what it raised, raised). A
    follower cancelled (another chat opened) only stops following."""
    seen = 0
    while True:
        version, update, done = await anyio.to_thread.run_sync(live.after, seen,
                                                               abandon_on_cancel=True)
        if version != seen and update is not None:
            yield update
        seen = version
        if done:
            if live.error is not None:
                raise live.error
            return
