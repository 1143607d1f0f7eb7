"""A turn's updates for Gradio's async handlers (the page and the named API).

Gradio stops an event (Stop, a cancelled gradio_client job, a closed tab) by cancelling its task.
A sync handler blocked in a worker thread on the next update can't see that: the cancel waits for
the thread, which waits for the whole prompt to be evaluated. Here the wait for each update is
abandoned on cancel, and the turn is stopped at its next step, within one decode, also mid-prompt;
the handler ends once the stopped reply is kept (what runs after it reads it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread

from reame.inference.turn import TurnUpdate
from reame.inference.turn_stream import TurnStream


async def turn_updates(start: Callable[[], TurnStream]) -> AsyncIterator[TurnUpdate]:
    """Start the turn in a worker thread (its refusals raise here) and yield its updates.
    Use it under contextlib.aclosing, so that a handler closed between two updates stops it
    too."""
    stream = await anyio.to_thread.run_sync(start)
    try:
        while True:
            update = await anyio.to_thread.run_sync(next, stream, None, abandon_on_cancel=True)
            if update is None:
                return
            yield update
    finally:
        with anyio.CancelScope(shield=True):  # even when cancelled: the reply is kept first
            await anyio.to_thread.run_sync(stream.stop)
