"""What the scheduler (scheduler.py) works with: a Task (one piece of work for the engine and
the queue its caller reads), a Slot (one of the engine's sequences), the Limits of the line,
what a caller is told (Waiting, End) or refused with (Replaced, Stopped), and which free
slot a task takes (pick_slot)."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from reame.config.reame_conf import setting
from reame.config.refusals import ServerBusy
from reame.inference.cache import KVCache
from reame.inference.engine import Engine, Sequence
from reame.inference.scope import Scope

log = logging.getLogger(__name__)

Work = Callable[[], Iterator[object]]


@dataclass(frozen=True)
class Limits:
    """How much the scheduler lets wait, and for how long a caller may stop asking. The
    defaults are reame.conf's ([server] max_waiting, stalled_reply_s, user_share)."""

    # tasks waiting for a slot, beyond the free slots
    max_waiting: int = setting("server", "max_waiting").default
    # a caller that asks for nothing this long is gone: its task ends
    stall_s: float = float(setting("server", "stalled_reply_s").default)
    # of the slots, and of the line, one user may hold (with accounts)
    share: float = setting("server", "user_share").default

    def per_user(self, slots: int) -> tuple[int, int]:
        """The slots and the places in line one user may hold."""
        return (max(1, math.floor(slots * self.share)),
                max(1, math.floor(self.max_waiting * self.share)))


class Replaced(ServerBusy):
    """The model was replaced before the task got a slot: nothing was done, send again."""

    def __init__(self):
        super().__init__("the model was replaced: send again", 1)


class Stopped(Exception):
    """The reserved task was stopped (cancelled, or a shutdown) before it got its slot."""


ADMITTED = object()  # put in a reserved task's queue when it gets its slot


@dataclass(frozen=True)
class Waiting:
    """Streamed to a task's caller while it waits for a slot: its place in line (1: next)."""

    position: int


@dataclass(eq=False)
class Slot:
    seq: Sequence
    task: "Task | None" = None
    used: float = 0.0  # when its last task ended (least recently used first out)


@dataclass(eq=False)
class Task:
    """One piece of work for the engine and the queue its caller reads."""

    work: Work | None  # None: reserved, its caller not ready yet
    chat_id: int | None
    scope: Scope
    prompt: list[int] | None
    background: bool
    owner: str | None = None  # the user it is for (fair shares); None: no accounts
    prelude: Work | None = None  # run on the task's slot while its caller gets ready
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    slot: Slot | None = None
    steps: Iterator[object] | None = None  # the prelude's or the work's, under way
    in_work: bool = False  # steps are the work's (not the prelude's)
    position: int = 0
    asked: int = 0  # items its caller has asked for
    given: int = 0  # items put in its queue
    idle_since: float | None = None  # its caller holds every item given, and asks for none

    @property
    def wants(self) -> bool:
        return self.given < self.asked

    @property
    def runnable(self) -> bool:
        """Whether it has a step to take now: its prelude (the caller need not ask), or its
        work once the caller has asked for an item."""
        if self.in_work:  # or a reply's next token to decode while its caller is busy
            return self.wants or (self.slot is not None and self.slot.seq.decode_ahead)
        if self.steps is not None or self.prelude is not None:
            return True
        return self.work is not None and self.wants

    def cancel(self) -> None:
        self.cancelled = True


class End:
    """The last item of a task's queue; error: what the work raised, if anything."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


def pick_slot(slots: list[Slot], task: Task, cache: KVCache, engine: Engine) -> Slot | None:
    """The free slot for task: the one holding its chat's KV (or, for a conversation
    found by its tokens, a good part of its prompt), else one beside the busy slots, the
    least recently used first.

    Beside: llama.cpp decodes the replies of slots whose sequences are not consecutive in
    separate passes (with a KV per sequence, a pass takes consecutive sequences only), so
    two replies written at once in slots 0 and 2 cost 26 ms a step and in slots 0 and 1,
    18 (SmolLM2, 2 threads; one reply alone, 13)."""
    free = [s for s in slots if s.task is None]
    if not free:
        return None
    for slot in free:
        live = cache.live_of(slot.seq)
        if (task.chat_id is not None and live.chat == task.chat_id
                and live.scope == task.scope and slot.seq.tokens):
            return slot
    reach: dict[Slot, int] = {}  # how far each slot's live KV goes into the prompt
    if task.prompt:
        for slot in free:
            if cache.live_of(slot.seq).scope != task.scope:
                continue
            engine.use(slot.seq)
            reach[slot] = engine.resume_point(task.prompt)
        best = max(free, key=lambda s: reach.get(s, 0))
        if reach.get(best, 0) >= WORTH_A_SLOT:
            return best
    # A few shared tokens (below WORTH_A_SLOT) are not worth a stored chat's live KV, which its
    # person's next message wants: such a slot counts as sharing none.
    busy = {s.seq.id for s in slots if s.task is not None}
    return min(free, key=lambda s: (_runs(busy | {s.seq.id}), -_worth(s, task, reach, cache),
                                    s.used))


def _worth(slot: Slot, task: Task, reach: dict[Slot, int], cache: KVCache) -> int:
    """The tokens a slot's live KV gives task when it is not worth a slot of its own: none
    where that KV is another stored chat's."""
    live = cache.live_of(slot.seq).chat
    return 0 if live is not None and live != task.chat_id else reach.get(slot, 0)


# Prompt tokens a slot's live KV must save for a task to take that slot over one beside the
# busy slots: below this (a shared opening, a template's header) it is a few milliseconds of
# prompt evaluation, against several per step of every reply written at once.
WORTH_A_SLOT = 128


def _runs(busy: set[int]) -> int:
    """In how many runs of consecutive slots the busy ones are (1 or 0: one pass)."""
    return sum(1 for k in busy if k - 1 not in busy)


def end_stalled(tasks: Iterable[Task], bound: float) -> float | None:
    """Cancel the tasks whose caller has asked for nothing for bound seconds (Limits.stall_s);
    the seconds until the next one would be, None if none."""
    now, soonest = time.monotonic(), None
    for task in tasks:
        if task.idle_since is None or task.cancelled:
            continue
        left = task.idle_since + bound - now
        if left <= 0:
            log.info("a caller asked for nothing for %.1f s: its turn (chat %s) is "
                     "stopped", bound, task.chat_id or "-")
            task.cancel()
        elif soonest is None or left < soonest:
            soonest = left
    return soonest


def stop_background(tasks: Iterable[Task]) -> None:
    """Cancel the background tasks (type-ahead) among tasks: a turn needs their slot."""
    for task in tasks:
        if task.background:
            task.cancel()
