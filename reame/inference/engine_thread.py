"""The scheduler's engine thread (a mixin of Scheduler, scheduler.py, whose module docstring
says how tasks take turns): rounds of steps, one per active task, then one decode of the
replies' queued tokens; admitting tasks from the line into free slots; a task's end."""

from __future__ import annotations

import logging
import time

from reame.inference.tasks import (
    ADMITTED,
    End,
    Task,
    Waiting,
    end_stalled,
    pick_slot,
    stop_background,
)

log = logging.getLogger(__name__)


class EngineThread:
    """Scheduler's engine-thread half: the state (_cond, _active, _line, slots, engine,
    cache, limits) is Scheduler.__init__'s."""

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
