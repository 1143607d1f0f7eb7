"""The writes of one process to a chat database taken in turn (WriteGate), and the decorator
of the Store methods that write (writes)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class WriteGate:
    """One write of this process at a time, taken in turn. SQLite writes one transaction at a
    time and a writer that finds it busy polls, sleeping longer and longer: between the
    batches of a long import it would rarely get in (another user's "New chat" waited
    seconds). Writers queue here instead, and the import lets the waiting ones go first."""

    def __init__(self):
        self._lock = threading.RLock()
        self._waiting = 0
        self._count = threading.Lock()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._count:
            self._waiting += 1
        self._lock.acquire()
        with self._count:
            self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def let_others_in(self, at_most_s: float = 1.0) -> None:
        """Wait (holding nothing) until the writes waiting now have started."""
        deadline = time.monotonic() + at_most_s
        while self._waiting and time.monotonic() < deadline:
            time.sleep(0.001)


def writes(method):
    """A Store method that writes: through the store's write gate."""
    @functools.wraps(method)
    def gated(self, *args, **kwargs):
        with self._gate.write():
            return method(self, *args, **kwargs)
    return gated
