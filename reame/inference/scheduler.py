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
import time
from collections import deque
from collections.abc import Callable, Iterator

from reame.config.refusals import RETRY_BUSY_S, ServerBusy
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
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
    end_stalled,
    pick_slot,
    stop_background,
)

log = logging.getLogger(__name__)


class Scheduler:
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

    # the engine's thread

    def _drive(self) -> None:
        try:
            self._drive_rounds()
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the engine's thread failed")
            with self._cond:
                tasks = [*self._active, *self._line]
                self._active.clear()
                self._line.clear()
                for slot in self.slots:
                    slot.task = None
                self._running = False
                self._cond.notify_all()
            for task in tasks:
                task.out.put(End(exc))
                task.done.set()

    def _drive_rounds(self) -> None:
        while True:
            with self._cond:
                while True:
                    timeout = end_stalled((*self._active, *self._line), self.limits.stall_s)
                    ready = self._ready()
                    if ready:
                        break
                    if not self._active and not self._line:
                        self._running = False
                        self._cond.notify_all()  # stop() waits for this
                        return
                    self._cond.wait(timeout)
            done: set[int] = set()
            while ready:
                task = ready.pop(0)
                done.add(id(task))
                if task.cancelled:
                    self._close(task)
                else:
                    self._step(task)
                # A task that came during this round takes its first step in it, not after
                # every other task's step (measured: 4 prompts sent at once to the 1.5B shape,
                # the 4th began 0.8 s after the others, a round of three 16-token decodes).
                with self._cond:
                    if self._line:
                        ready += [t for t in self._ready()
                                  if id(t) not in done and t not in ready]
            # The replies' next tokens queued in this round: one decode for all of them.
            self.engine.decode_pending()

    def _ready(self) -> list[Task]:
        """Admit what can be, then the active tasks that can take a step (the lock is held)."""
        self._drop_cancelled()
        self._admit()
        others = any(not t.background for t in self._active)
        return [t for t in self._active
                if t.cancelled or (t.runnable and not (t.background and others))]

    def _drop_cancelled(self) -> None:
        for task in [t for t in self._line if t.cancelled]:
            self._line.remove(task)
            self._finish(task, self._stopped())  # nothing was done: a switch says so

    def _admit(self) -> None:
        """Give free slots to the tasks in line, first come first served; a background task
        gives its slot (or its chat) up to a task in line. A user at their share of the slots
        waits, and lets the others pass."""
        share = self.limits.per_user(len(self.slots))[0]
        for task in list(self._line):
            same_chat = [t for t in self._active
                         if task.chat_id is not None and t.chat_id == task.chat_id]
            if same_chat:  # after the chat's task under way
                if not task.background:
                    stop_background(same_chat)
                continue
            if task.owner is not None and sum(
                    t.owner == task.owner for t in self._active) >= share:
                continue
            slot = pick_slot(self.slots, task, self.cache, self.engine)
            if slot is None:
                if not task.background:
                    stop_background(self._active)
                break
            self._line.remove(task)
            slot.task, task.slot = task, slot
            self._active.append(task)
            if task.work is None:  # reserved: its caller waits for this
                task.given += 1
                task.out.put(ADMITTED)
        self._tell_positions()

    def _tell_positions(self) -> None:
        """Tell the tasks waiting for a slot their place, when they ask for an item."""
        chats = {t.chat_id for t in self._active if t.chat_id is not None}
        position = 0
        for task in self._line:
            if task.background or task.chat_id in chats:
                continue  # not waiting for a slot
            position += 1
            if task.position != position and task.wants:
                task.position = position
                self._give(task, Waiting(position))

    def _give(self, task: Task, item: object) -> None:
        """Put an item the caller asked for in its queue; from then its caller is idle until
        it asks again."""
        task.given += 1
        if not task.wants:
            task.idle_since = time.monotonic()
        task.out.put(item)

    def _step(self, task: Task) -> None:
        self.engine.use(task.slot.seq)
        try:
            if task.steps is None:
                if task.prelude is not None:
                    task.steps, task.prelude = task.prelude(), None
                else:
                    task.steps, task.in_work = task.work(), True
            item = next(task.steps)
        except StopIteration:
            if not task.in_work:
                task.steps = None  # the prelude ended: the work comes next, on this slot
                return
            self._finish(task, None)
        except BaseException as exc:
            if not task.in_work:  # a failed prelude is work not done ahead, nothing more
                log.exception("work ahead of a task failed")
                task.steps = None
                return
            self._finish(task, exc)  # the caller gets it; the engine's thread goes on
        else:
            if item is not None and task.in_work and getattr(item, "done", False) is True:
                self._end_with(task, item)
            elif item is not None and task.in_work:
                with self._cond:
                    self._give(task, item)
                # A reply's token was given: queue its next one in this same round, so that
                # the replies being written stay in step and are decoded together (otherwise a
                # reply that came in a round out of step queued in the others' off rounds and
                # was decoded alone: measured, 4 replies at once 0.8x slower).
                if task.slot.seq.decode_ahead and not task.cancelled:
                    self._step(task)

    def _end_with(self, task: Task, last: object) -> None:
        """A work's last item (done: a turn's reply, kept): run the work to its end and free
        its slot before the caller gets the item, so that a caller who sends its next request
        as soon as it has the answer finds the slot free and its KV live there."""
        error = None
        try:
            next(task.steps)
        except StopIteration:
            pass
        except BaseException as exc:
            error = exc
        else:
            task.steps.close()
            error = RuntimeError("a task's work went on after its last item")
        self._finish(task, error, last=last if error is None else None)

    def _close(self, task: Task) -> None:
        """Stop a cancelled task: its generator's finally blocks run here (a reply keeps what
        it has)."""
        error = None
        if task.steps is not None:
            self.engine.use(task.slot.seq)
            try:
                task.steps.close()
            except BaseException as exc:
                log.exception("a stopped task failed while winding down")
                error = exc
        elif task.work is None:  # reserved, its caller not back yet: it tells them
            error = self._stopped()
        self._finish(task, error)

    def _finish(self, task: Task, error: BaseException | None, *,
                last: object | None = None) -> None:
        """The task's slot is free; then its caller gets last (if any) and its end."""
        with self._cond:
            if task in self._active:
                self._active.remove(task)
            if task.slot is not None:
                task.slot.task, task.slot.used = None, time.monotonic()
            task.idle_since = None
            self._cond.notify_all()
        if last is not None:
            task.given += 1
            task.out.put(last)
        task.out.put(End(error))
        task.done.set()
