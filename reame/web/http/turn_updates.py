"""A turn's updates for the event loop: the page, the named API and /v1.

One worker thread per turn iterates its TurnStream and hands each update to the event loop
(UpdateFeed): a token costs one wake-up of the loop, where waiting for each update in a worker
thread of its own (anyio's run_sync per update) cost two thread hand-offs, and on a 2-core
machine every hand-off is taken from llama.cpp's threads (profiled: one reply alone ran at
0.97x llama-server's tokens/s that way).

Gradio stops an event (Stop, a cancelled gradio_client job, a closed tab) by cancelling its task;
/v1 sees its client hang up. Either way the wait for the next update ends at once, and the turn
is stopped at its next step, within one decode, also mid-prompt; turn_updates ends once the
stopped reply is kept (what runs after it reads it).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread

from reame.inference.turn import TurnUpdate
from reame.inference.turn_stream import TurnStream

_END = object()  # the turn has no more updates (or the feed was interrupted)


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


class UpdateFeed:
    """stream's updates, pumped into the running event loop by one worker thread."""

    def __init__(self, stream: TurnStream):
        self.stream = stream
        self._loop = asyncio.get_running_loop()
        self._items: deque = deque()  # updates, then _END or _Raised
        self._arrived = asyncio.Event()
        self._interrupted = False
        self._pump = asyncio.ensure_future(anyio.to_thread.run_sync(self._run))
        self._pump.add_done_callback(_forget)

    def _run(self) -> None:
        """In the worker thread: every update, then the end or what the turn raised."""
        put = functools.partial(self._loop.call_soon_threadsafe, self._put)
        try:
            for update in self.stream:
                put(update)
        except BaseException as exc:  # raised by next()
            put(_Raised(exc))
        else:
            put(_END)

    def _put(self, item: object) -> None:
        self._items.append(item)
        self._arrived.set()

    async def next(self, *, latest: bool = False) -> TurnUpdate | None:
        """The next update; None at the turn's end or once interrupted. What the turn raised
        is raised here. latest: the last of the updates already there (for a consumer that
        shows the reply so far: one that fell behind catches up at once)."""
        while not self._items and not self._interrupted:
            self._arrived.clear()
            await self._arrived.wait()
        if self._interrupted:
            return None
        item = self._items.popleft()
        while latest and isinstance(item, TurnUpdate) and self._items and isinstance(
                self._items[0], TurnUpdate):
            item = self._items.popleft()
        if item is _END:
            self._items.appendleft(_END)  # and at every later call
            return None
        if isinstance(item, _Raised):
            raise item.exc
        return item

    def interrupt(self) -> None:
        """From the event loop: stop the turn, and let next() return None without waiting for
        the updates still to come."""
        self.stream.cancel()
        self._interrupted = True
        self._arrived.set()

    async def stop(self) -> None:
        """Stop the turn and wait until its reply is kept and its slot free."""
        await anyio.to_thread.run_sync(self.stream.stop)


def _forget(pump: asyncio.Future) -> None:
    if not pump.cancelled():
        pump.exception()


async def turn_updates(start: Callable[[], TurnStream]) -> AsyncIterator[TurnUpdate]:
    """Start the turn in a worker thread (its refusals raise here) and yield its updates,
    the latest of those that arrived meanwhile each time (each holds the reply so far). Use it under contextlib.aclosing, so that a handler closed between two updates stops it
    too."""
    feed = UpdateFeed(await anyio.to_thread.run_sync(start))
    try:
        while (update := await feed.next(latest=True)) is not None:
            yield update
    finally:
        with anyio.CancelScope(shield=True):  # even when cancelled: the reply is kept first
            await feed.stop()
