"""A turn's stream of updates, with a way to stop it from any thread.

ChatService's turns return a TurnStream: iterate it for the updates, close() it to stop from the
thread that iterates (a generator's close), or cancel() it from anywhere — an event loop that saw
the client hang up, a Stop — while another thread waits for its next update. Either way the
turn's task ends at its next step and its slot is free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reame.inference.scheduler import Scheduler
    from reame.inference.tasks import Task
    from reame.inference.turn import TurnUpdate


class TurnStream:
    def __init__(self, make: Callable[["TurnStream"], Iterator["TurnUpdate"]]):
        self._lock = threading.Lock()
        self._where: tuple[Scheduler, Task] | None = None
        self.cancelled = False
        self._updates = make(self)

    def __iter__(self) -> "TurnStream":
        return self

    def __next__(self) -> "TurnUpdate":
        return next(self._updates)

    def close(self) -> None:
        self._updates.close()

    def cancel(self) -> None:
        """Stop the turn at its next step, from any thread (its reply keeps what it has)."""
        with self._lock:
            self.cancelled = True
            where = self._where
        if where is not None:
            where[0].cancel(where[1])

    def stop(self, timeout: float = 30.0) -> bool:
        """cancel(), then wait until the turn's task has ended (its reply kept, its slot free);
        False if it had not within timeout."""
        self.cancel()
        with self._lock:
            where = self._where
        return where is None or where[1].done.wait(timeout)

    def bind(self, scheduler: "Scheduler", task: "Task") -> None:
        """The task that runs the turn now (a cancel() before this stops it at once)."""
        with self._lock:
            self._where = (scheduler, task)
            cancelled = self.cancelled
        if cancelled:
            scheduler.cancel(task)
