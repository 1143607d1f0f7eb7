"""One thread drives the engine; the turns of several people take turns on it.

Every piece of work that uses the engine (a turn, a restore ahead of a turn, type-ahead) is a
Task: a generator run on the engine's thread, one step per `next()`. A step is one decode (at
most batches.CHUNK prompt tokens), or a reply's next token: sampled, or queued for decoding;
whatever a step yields besides None is streamed to the task's caller. The active tasks' steps
go round in turn, and after each round the tokens the replies queued are decoded together, in
one llama_decode (Engine.decode_pending; one per reply with [model] exact_under_load), as
llama-server batches its slots. So a new message's first token waits for its own prefill plus
one step of each other reply, never for another reply to end. A task steps on only once its
caller has asked for the next item (as a plain generator would), except to decode the token
its caller was just given (Sequence.decode_ahead): the next token is computed while the caller
sends the last one, and a stopped reply has exactly what its caller saw. A work's last item
(one whose `done` is True: a turn's kept reply) is handed over only once the work has ended
and its slot is free, so a client that sends its next message the moment it has the answer
finds its KV live in that slot.

However its caller goes away, a task ends: closing its stream, cancel() (a Stop, a client that
hung up), cancel_chat(), stop(cancel=True) (a shutdown, a model switch), and a caller that
stops asking: a task whose caller has held every item it was given for Limits.stall_s (a
client that stopped reading, a stream dropped without being closed) is cancelled then. A
cancelled task stops at its next step, within one decode, and gives its slot back.

Each active task has a slot: one of the engine's sequences (engine.Sequence), its own KV
cells. A slot keeps its KV when its task ends, so a chat's next turn goes back to the slot that
holds its history ("live": nothing restored); a task with no such slot takes the one used
least recently. With every slot busy, tasks wait in a bounded line (`Waiting` tells each its
place); past the bound, reserve() refuses (ServerBusy). A chat's tasks run one after another.

Background tasks (type-ahead) never wait in line and run only while no other task is active; a
task that needs their slot, or their chat, stops them.

The engine's thread runs while there is work and ends when there is none (a new task starts
another), so an idle scheduler holds no thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator

from reame.config.refusals import RETRY_BUSY_S, ServerBusy
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.engine_thread import EngineThread
from reame.inference.scope import NO_ACCOUNTS, Scope
from reame.inference.tasks import (
    ADMITTED,
    End,
    Limits,
    Slot,
    Stopped,
    Task,
    Waiting,
    Work,
)

log = logging.getLogger(__name__)


class Scheduler(EngineThread):
    """Runs tasks on one engine from its own thread."""

    def __init__(self, engine: Engine, cache: KVCache, limits: Limits = Limits()):
        self.engine, self.cache = engine, cache
        self.limits = limits
        self.slots = [Slot(seq) for seq in engine.sequences]
        self._line: deque[Task] = deque()  # waiting for a slot, first come first served
        self._active: list[Task] = []
        self._cond = threading.Condition()
        self._running = False  # the engine's thread
        self._stopping = False
        self._stop_error: Callable[[], BaseException] | None = None  # tasks in line: why

    def _stopped(self) -> BaseException | None:
        """A new exception saying why a task in line ends unrun (each caller raises its own)."""
        return self._stop_error() if self._stop_error is not None else None

    @property
    def max_waiting(self) -> int:
        return self.limits.max_waiting

    def stop(self, *, cancel: bool = False,
             error: Callable[[], BaseException] | None = None) -> None:
        """Refuse new tasks; return once the tasks under way are done. With cancel, they are
        stopped at their next step (a shutdown, a model switch); tasks still in line end
        with error() (None: they just end)."""
        with self._cond:
            self._stopping = True
            if cancel:
                self._stop_error = error
                for task in (*self._active, *self._line):
                    task.cancel()
            self._cond.notify_all()
            while self._running and threading.current_thread().name != "reame-engine":
                self._cond.wait()

    # the callers' side

    def stream(self, work: Work, *, chat_id: int | None = None, scope: Scope = NO_ACCOUNTS,
               prompt: list[int] | None = None, owner: str | None = None) -> Iterator[object]:
        """Run work's steps on the engine and yield what they yield (Waiting while in line);
        re-raise what work raises. Closing this iterator stops the work at its next step and
        waits for it to wind down (its finally blocks run on the engine's thread)."""
        task = self.reserve(chat_id=chat_id, scope=scope, prompt=prompt, owner=owner)
        return self.results(task, work)

    def reserve(self, *, chat_id: int | None = None, scope: Scope = NO_ACCOUNTS,
                prompt: list[int] | None = None, prelude: Work | None = None,
                owner: str | None = None) -> Task:
        """A place in line for work to come (results() gives it), or ServerBusy now, before
        the caller changes anything. prelude, if any, runs on the task's slot once it has one
        (e.g. restoring the chat's KV while the caller builds the prompt). wait_for_slot()
        tells the caller when the task holds its slot. A reserved place not used is given back
        with cancel()."""
        task = Task(None, chat_id, scope, prompt, background=False, prelude=prelude,
                    owner=owner)
        with self._cond:
            if self._stopping:
                raise self._stopped() or ServerBusy(
                    "the model is being replaced: try again in a moment", RETRY_BUSY_S)
            waiting = sum(not t.background for t in self._line)
            free = sum(s.task is None or s.task.background for s in self.slots)
            if waiting + 1 > free + self.limits.max_waiting:  # it would wait beyond the bound
                raise ServerBusy(
                    f"the server is full: {len(self.slots) - free} replies are being written "
                    f"and {waiting} are waiting. Try again in a moment.", RETRY_BUSY_S)
            if owner is not None:
                slots, places = self.limits.per_user(len(self.slots))
                mine = sum(t.owner == owner and not t.background
                           for t in (*self._active, *self._line))
                if mine >= slots + places:
                    raise ServerBusy(
                        f"you have {mine} replies being written or waiting, the most one user "
                        "may have at once on this server. Try again when one has ended.",
                        RETRY_BUSY_S)
            self._enter(task)
        return task

    def cancel(self, task: Task) -> None:
        with self._cond:
            task.cancel()
            self._cond.notify_all()

    def cancel_chat(self, chat_id: int) -> int:
        """Stop the chat's tasks, under way or waiting (a Stop in the page); how many."""
        with self._cond:
            tasks = [t for t in (*self._active, *self._line)
                     if t.chat_id == chat_id and not t.background and not t.cancelled]
            for task in tasks:
                task.cancel()
            self._cond.notify_all()
        return len(tasks)

    def wait_for_slot(self, task: Task) -> Iterator[Waiting]:
        """Yield the reserved task's place in line (Waiting) until it holds its slot. Raises
        the scheduler's stop error (Replaced) if it was stopped before that, or Stopped if
        the task was cancelled meanwhile."""
        while True:
            self._ask(task)
            item = task.out.get()
            if item is ADMITTED:
                return
            if isinstance(item, End):
                raise item.error or Stopped()
            yield item

    def results(self, task: Task, work: Work) -> Iterator[object]:
        """Let the reserved task run work; its stream (as stream())."""
        with self._cond:
            task.work = work
            self._cond.notify_all()
        return self._results(task)

    def run(self, work: Work, **where) -> object:
        """Run work to its end and return its last yielded item (None if none)."""
        last = None
        for item in self.stream(work, **where):
            if not isinstance(item, Waiting):
                last = item
        return last

    def try_run(self, work: Work, *, chat_id: int | None = None, scope: Scope = NO_ACCOUNTS,
                background: bool = False) -> tuple[bool, object]:
        """Run work now if a slot is free and nobody waits for one, else not at all; with
        background, only while no other task is active either, at the lowest priority (a task
        that comes meanwhile stops it). (started, work's last item)."""
        task = Task(work, chat_id, scope, None, background=background)
        with self._cond:
            if (self._stopping or any(not t.background for t in self._line)
                    or all(s.task is not None for s in self.slots)
                    or background and any(not t.background for t in self._active)):
                return False, None
            self._enter(task)
        last = None
        for item in self._results(task):
            last = item
        return True, last

    @property
    def busy(self) -> int:
        """Tasks active or waiting (background ones not counted)."""
        with self._cond:
            return sum(not t.background for t in (*self._active, *self._line))

    def load(self) -> tuple[int, int]:
        """Turns on a slot and turns waiting for one (background tasks not counted)."""
        with self._cond:
            return (sum(not t.background for t in self._active),
                    sum(not t.background for t in self._line))

    def writing(self) -> set[int]:
        """The chats whose turn holds a slot or waits for one."""
        with self._cond:
            return {t.chat_id for t in (*self._active, *self._line)
                    if t.chat_id is not None and not t.background and not t.cancelled}

    def _enter(self, task: Task) -> None:
        """Put task in line and make sure the engine's thread runs (the lock is held)."""
        self._line.append(task)
        if not self._running:
            self._running = True
            threading.Thread(target=self._drive, name="reame-engine", daemon=True).start()
        self._cond.notify_all()

    def _ask(self, task: Task) -> None:
        with self._cond:
            task.asked += 1
            task.idle_since = None
            self._cond.notify_all()

    def _results(self, task: Task) -> Iterator[object]:
        try:
            while True:
                self._ask(task)
                item = task.out.get()
                if item is ADMITTED:  # reserved and given its work before that
                    continue
                if isinstance(item, End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            if not task.done.is_set():
                self.cancel(task)
                task.done.wait()
