"""Who may use the engine: turns together, a model switch alone.

Many turns hold the gate at once (the scheduler interleaves them); a model switch waits until
none does, and from the moment it asks, new turns wait for it rather than pass it (a switch is
never starved by a stream of turns).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Gate:
    def __init__(self):
        self._cond = threading.Condition()
        self._turns = 0
        self._switching = False  # asked for or under way

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._cond:
            while self._switching:
                self._cond.wait()
            self._turns += 1
        try:
            yield
        finally:
            self._leave()

    @contextmanager
    def try_turn(self) -> Iterator[bool]:
        """A turn if no switch is asked for or under way (True), else nothing (False)."""
        with self._cond:
            entered = not self._switching
            self._turns += entered
        try:
            yield entered
        finally:
            if entered:
                self._leave()

    def _leave(self) -> None:
        with self._cond:
            self._turns -= 1
            self._cond.notify_all()

    @contextmanager
    def switch(self) -> Iterator[None]:
        with self._cond:
            while self._switching:
                self._cond.wait()
            self._switching = True
            while self._turns:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._switching = False
                self._cond.notify_all()
