"""How a turn's updates reach the event loop (reame/web/http/turn_updates.py): in order, the
latest of those waiting for a consumer that shows the reply so far, the turn's error raised
where it is awaited, and an interrupt that does not wait for the turn. The turn here is a plain
generator of updates: what is tested is the hand-off, not the model (the servers' tests run it
with the model)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from reame.inference.turn import TurnUpdate
from reame.inference.turn_stream import TurnStream
from reame.web.http.turn_updates import UpdateFeed, turn_updates


def stream_of(updates, *, gate: threading.Event | None = None, error=None) -> TurnStream:
    def make(stream):
        for n, update in enumerate(updates):
            if gate is not None and n == 1:
                gate.wait(10)  # the turn's second update comes only when the test says
            if stream.cancelled:
                return
            yield update
        if error is not None:
            raise error
    return TurnStream(make)


UPDATES = [TurnUpdate("a" * n) for n in range(1, 40)] + [TurnUpdate("a" * 40, done=True)]


def test_updates_come_in_order_and_a_consumer_that_fell_behind_gets_the_latest():
    async def run():
        feed = UpdateFeed(stream_of(UPDATES))
        every = [await feed.next() for _ in UPDATES]
        assert every == UPDATES and await feed.next() is None and await feed.next() is None

        feed = UpdateFeed(stream_of(UPDATES))
        first = await feed.next()
        await asyncio.sleep(0.3)  # all the others arrive meanwhile
        assert (first, await feed.next(latest=True), await feed.next()) == (
            UPDATES[0], UPDATES[-1], None)

    asyncio.run(asyncio.wait_for(run(), 30))


def test_the_turns_error_is_raised_where_it_is_awaited():
    async def run():
        async for update in turn_updates(lambda: stream_of(UPDATES[:2], error=KeyError("x"))):
            assert update in UPDATES[:2]

    with pytest.raises(KeyError):
        asyncio.run(asyncio.wait_for(run(), 30))


def test_an_interrupt_ends_the_wait_at_once_and_stops_the_turn():
    gate = threading.Event()

    async def run():
        stream = stream_of(UPDATES, gate=gate)
        feed = UpdateFeed(stream)
        assert await feed.next() == UPDATES[0]
        waiting = asyncio.ensure_future(feed.next())
        await asyncio.sleep(0.1)
        assert not waiting.done(), "the turn has nothing more yet"
        feed.interrupt()
        assert await asyncio.wait_for(waiting, 1) is None and stream.cancelled
        gate.set()
        await feed.stop()

    asyncio.run(asyncio.wait_for(run(), 30))
