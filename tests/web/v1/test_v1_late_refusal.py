"""A /v1 request answered whole that waited in line and was then refused (the model was
switched while it waited, and the new model's line was full: seen in the chaos test) gets the
refusal's own status, 429 with Retry-After, as if refused at once; it was a 500.

The turn here is a real TurnStream and UpdateFeed (the worker thread, the event loop) over a
turn that waits in line and is then refused, as Turns._stateless raises it; the server around
it is not what this is about (tests/whole/test_chaos.py meets it there, at random)."""

from __future__ import annotations

import asyncio
import json

import pytest

from reame.config.refusals import ServerBusy
from reame.inference.turn import TurnUpdate
from reame.inference.turn_stream import TurnStream
from reame.web.v1.common import last_update, started


def waits_then_refused(stream: TurnStream):
    yield TurnUpdate("", queued=1)
    raise ServerBusy("the server is full: 0 replies are being written and 6 are waiting. "
                     "Try again in a moment.", retry_after=2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prompt_param", ["messages", "prompt"])
def test_a_refusal_after_waiting_in_line_is_its_status_not_500(prompt_param):
    async def answer():
        gone = asyncio.get_running_loop().create_future()
        updates = await started(lambda: TurnStream(waits_then_refused), gone)
        first = await updates.next()
        assert first.queued == 1
        return await last_update(updates, first, gone, prompt_param)

    response = asyncio.run(answer())
    assert response.status_code == 429, response.body
    assert int(response.headers["Retry-After"]) >= 1
    error = json.loads(response.body)["error"]
    assert "the server is full" in error["message"], error
