"""PDFs read in bounded processes (reame/chats/pdf_worker.py), a few at a time, in turn by user.

Reading a PDF costs CPU seconds, a crafted one minutes (pdf_worker says why and how that is
bounded). Run in the server's own process it held a core and the GIL, and the page's attach
event, one at a time for everyone, made every other person's attachments wait behind it. So:

- read_pdf runs pdf_worker as a child process with the file on stdin and kills it at the
  wall-clock bound; the caller's thread waits, the event loop never does;
- PdfReaders hands out `slots` readers (as many as the cores, at most 4) in the order asked,
  one per user at a time: one user's eight PDFs take one slot, one after the other, and
  another user's PDF takes the next free slot before that user's second. Text files need no
  reader: they are read at once, whoever is reading PDFs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import reame
from reame.chats.pdf_worker import Limits
from reame.config.refusals import DocumentRefused

MAX_PAGES = 1000  # of a PDF read (its text must fit the context anyway)
LIMITS = Limits(max_pages=MAX_PAGES)
SLOTS = max(1, min(os.cpu_count() or 1, 4))  # readers at once, server-wide
MAX_WAITING = 8  # PDFs of one user waiting for a reader or being read
_ROOT = Path(reame.__file__).resolve().parent.parent  # where `-m reame.chats...` is found


def read_pdf(name: str, data: bytes, limits: Limits = LIMITS) -> str:
    """The text of the PDF data (its name, for the words of a refusal), read in a child
    process within limits, or DocumentRefused saying why not."""
    if not data.lstrip()[:5] == b"%PDF-":
        raise DocumentRefused(f"{name} is not a PDF file")
    command = [sys.executable, "-m", "reame.chats.pdf_worker", limits.argument(),
               str(os.getpid())]
    try:
        done = subprocess.run(command, input=data, capture_output=True, cwd=_ROOT,
                              timeout=limits.wall_s)
    except subprocess.TimeoutExpired:  # run() has killed it
        raise DocumentRefused(f"{name} could not be read within {limits.wall_s:g} s: it is "
                              "refused") from None
    except OSError as exc:
        raise DocumentRefused(f"{name} could not be read: no PDF reader could start ({exc})"
                              ) from None
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise DocumentRefused(f"{name} takes more than {limits.cpu_s:,} s of CPU time to read: "
                              "it is refused")
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        raise DocumentRefused(f"{name} could not be read as a PDF (its reader stopped with "
                              f"status {done.returncode})")
    if "refused" in answer:
        raise DocumentRefused(f"{name} {answer['refused']}")
    return answer["text"]


class PdfReaders:
    """The server's PDF readers: `read` waits for its turn in a fair line (see above)."""

    def __init__(self, slots: int = SLOTS, max_waiting: int = MAX_WAITING,
                 limits: Limits = LIMITS):
        self.slots, self.max_waiting, self.limits = slots, max_waiting, limits
        self._changed = threading.Condition()
        self._line: deque[tuple[str, object]] = deque()  # (user, ticket), in the order asked
        self._reading: set[str] = set()  # users with a PDF being read
        self._asked: dict[str, int] = {}  # user -> PDFs waiting or being read

    def read(self, user: str, name: str, data: bytes) -> str:
        """read_pdf(name, data) for user, once it is their turn."""
        with self.turn(user, name):
            return read_pdf(name, data, self.limits)

    @contextmanager
    def turn(self, user: str, name: str = "this PDF"):
        """Wait until a reader is free and user's turn has come (no other PDF of theirs being
        read, nobody before them in line who could be served); the reader is theirs within."""
        ticket = object()
        with self._changed:
            if self._asked.get(user, 0) >= self.max_waiting:
                raise DocumentRefused(f"{name} was not read: {self.max_waiting} of your PDFs "
                                      "are being read or wait for it; attach it once they are "
                                      "done")
            self._asked[user] = self._asked.get(user, 0) + 1
            self._line.append((user, ticket))
            try:
                self._changed.wait_for(lambda: self._next() is ticket)
            except BaseException:
                self._leave(user, ticket)
                raise
            self._line.remove((user, ticket))
            self._reading.add(user)
        try:
            yield
        finally:
            with self._changed:
                self._reading.discard(user)
                self._leave(user, None)

    def _next(self) -> object | None:
        """The ticket served next: the first in line whose user has nothing being read, if a
        reader is free."""
        if len(self._reading) >= self.slots:
            return None
        return next((ticket for user, ticket in self._line if user not in self._reading), None)

    def _leave(self, user: str, ticket: object | None) -> None:
        """user's ask is done (ticket: still in line); the others' turns may have come."""
        if ticket is not None:
            self._line.remove((user, ticket))
        self._asked[user] -= 1
        if not self._asked[user]:
            del self._asked[user]
        self._changed.notify_all()
