"""Gradio's event queue, polling only as often as there is something to poll for.

Gradio 6's queue (gradio/queueing.py) looks for new events every 1 ms and for progress updates
every 10 ms, whether or not anything happens (its `sleep_when_free` on Linux). On this 2-core
machine that is 9 % of a core while the server does nothing, and while it decodes the wake-ups
are taken from llama.cpp's two threads, each of which waits for the other at every step of a
decode.

`poll_gently` makes the queue look every 1 ms only while events wait for a free place, and
every IDLE_S otherwise: an event sent to an idle server starts at most IDLE_S later. The page
uses no gr.Progress, so progress is looked for every PROGRESS_S.

And it turns off the queue's analytics summary: after every event Gradio builds a pandas
DataFrame of the last 10,000 events and groups it by function (for its /monitoring page), in a
worker thread beside llama.cpp's, and it is what made the server import pandas at all (30 MB
more held from the first event on). Reame's own figures are on /metrics. The summary is never
recomputed and the queue keeps one event's record, not 10,000.
"""

from __future__ import annotations

import sys

from gradio.queueing import Queue

WAITING_S = 0.001  # Gradio's own, while events wait for a place
IDLE_S = 0.01
PROGRESS_S = 0.1


class GentleQueue(Queue):
    @property
    def sleep_when_free(self) -> float:
        return WAITING_S if len(self) else IDLE_S

    @sleep_when_free.setter
    def sleep_when_free(self, value: float) -> None:
        pass  # Queue.__init__ sets its 1 ms: the property decides instead

    @property
    def progress_update_sleep_when_free(self) -> float:
        return PROGRESS_S

    @progress_update_sleep_when_free.setter
    def progress_update_sleep_when_free(self, value: float) -> None:
        pass


def poll_gently(queue: Queue) -> Queue:
    """The queue Blocks.queue() made, polling as GentleQueue does (the same object: Gradio
    keeps references to it), its analytics summary off."""
    queue.__class__ = GentleQueue
    queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize  # (Gradio's spelling) never recomputed
    queue.ANALYTICS_MAX_EVENTS = 1
    return queue
