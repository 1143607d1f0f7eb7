"""The loaded model and everything made for it, replaced as one thing at a model switch.

A ModelRuntime holds the engine, its KV cache, its prompt builder and its scheduler. A turn takes
the service's current runtime once and uses only it: a switch installs a new runtime in one
step, and the old one is retired: its turns under way are stopped at their next step (each
keeps what it wrote), the turns still waiting for a slot are told to go to the new runtime
(Replaced), and its engine is closed only once no thread uses it. A thread that uses the engine
outside the scheduler (tokenizing a prompt) holds a lease meanwhile; leases are held for
straight-line code only, never across a yield, so no caller that goes away can keep one.

What runs on the engine is asked of the runtime by what it does, never as code to run there:
a turn on a reserved place (run_turn), a prompt evaluated ahead while it is typed (type_ahead),
a chat's KV restored ahead of its turn (restore_ahead, restore_ahead_prelude), an opening shared
(share). So the engine, its cache and its scheduler could live in another process: the callers
hand over a Job and a Keeper, and receive what the turn streams.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from reame.inference.cache import KVCache
from reame.inference.decoding import Decoding
from reame.inference.engine import Engine
from reame.inference.prompt import PromptBuilder
from reame.inference.scheduler import Scheduler
from reame.inference.scope import Scope
from reame.inference.tasks import Limits, Replaced, Task, Work
from reame.inference.turn import Job, Keeper, TurnObserver, TurnRunner, TurnStats
from reame.inference.warmup import warm_runtime

log = logging.getLogger(__name__)


class ModelRuntime:
    def __init__(self, engine: Engine, cache: KVCache, limits: Limits,
                 prompts: PromptBuilder | None = None):
        self.engine, self.cache, self.limits = engine, cache, limits
        self.prompts = prompts or PromptBuilder(engine)
        self.scheduler = Scheduler(engine, cache, limits)
        self._cond = threading.Condition()
        self._leases = 0
        self._retired = False

    @property
    def retired(self) -> bool:
        return self._retired

    @property
    def kv_folder(self) -> Path | None:
        """The local folder of the KV files, if they are in one (ReplyMemory keeps its file
        beside them)."""
        return getattr(self.cache.files, "folder", None) if self.cache.files else None

    def warm(self, system_prompt: str) -> None:
        """The warm-up at start (warmup.py)."""
        warm_runtime(self, system_prompt)

    @contextmanager
    def lease(self) -> Iterator["ModelRuntime"]:
        """Use the engine from this thread (e.g. tokenize) while the block runs: it stays open.
        Replaced if the runtime is retired already."""
        with self._cond:
            if self._retired:
                raise Replaced()
            self._leases += 1
        try:
            yield self
        finally:
            with self._cond:
                self._leases -= 1
                self._cond.notify_all()

    def retire(self) -> None:
        """Stop serving: turns under way stop at their next step (keeping what they wrote),
        turns waiting for a slot end with Replaced; return once nothing uses the engine and
        the KV files are written. The engine stays open (close() closes it)."""
        with self._cond:
            self._retired = True
        self.scheduler.stop(cancel=True, error=Replaced)
        with self._cond:
            while self._leases:
                self._cond.wait()
        self.cache.flush()

    # what runs on the engine

    def run_turn(self, place: Task, job: Job, keeper: Keeper,
                 observe: TurnObserver | None = None) -> Iterator[object]:
        """The turn of job on the reserved place (Scheduler.reserve): what it streams, as
        Scheduler.results; keeper keeps its reply however it ends; observe is told of it."""
        runner = self._runner(observe)
        return self.scheduler.results(place, lambda: runner.run(job, keeper))

    def type_ahead(self, job: Job, typed: Callable[[], None] | None = None) -> int:
        """Evaluate job's prompt now, as its turn would, if the engine is idle (a background
        task: any turn that comes stops it): the tokens evaluated (0: none, or nothing to do).
        typed, if given, is called on the engine's thread once the prompt is evaluated."""
        runner = self._runner(None)

        def steps() -> Iterator[int | None]:
            if self.engine.ready_for(job.prompt):
                return  # done already
            stats = TurnStats()
            restored = yield from runner.prefill_steps(job, stats)
            self.cache.typed(job.chat_id, restored, len(job.prompt))
            yield stats.prefilled

        _, prefilled = self.scheduler.try_run(steps, chat_id=job.chat_id, scope=job.scope,
                                              background=True)
        return prefilled or 0

    def write_aside(self, job: Job) -> str | None:
        """Write a short reply to job's prompt now, if the engine is idle, as a background
        task that any turn stops (a chat's title, written by the model): its text, or None
        if it did not run or was stopped. Nothing of it is kept: no file, no snapshot of its
        opening (job.plain), no chat's slot (chat_id None, a scope of its own)."""
        runner = self._runner(None)

        def steps() -> Iterator[str | None]:
            yield from runner.prefill_steps(job, TurnStats())
            decoding = Decoding(self.engine, job.sampling, job.max_tokens,
                                self.prompts.stops + job.stops, time.perf_counter())
            for _ in decoding:
                yield None
            yield decoding.text

        started, text = self.scheduler.try_run(steps, scope=job.scope, background=True)
        return text if started and isinstance(text, str) else None

    def restore_ahead(self, chat_id: int, scope: Scope) -> bool:
        """Restore the chat's KV file into a free slot now, unless every slot is busy or
        someone waits for one: whether something was restored."""
        if not self.cache.has_file(chat_id):
            return False  # nothing to restore: no slot given up for it
        started, restored = self.scheduler.try_run(
            lambda: self._restore_ahead_steps(chat_id, scope), chat_id=chat_id, scope=scope)
        return bool(started and restored)

    def restore_ahead_prelude(self, chat_id: int, scope: Scope) -> Work | None:
        """What a turn's slot does while its caller reads the database and tokenizes the
        prompt (Scheduler.reserve's prelude): restore the chat's KV file, if it has one."""
        if not self.cache.has_file(chat_id):
            return None
        return lambda: self._restore_ahead_steps(chat_id, scope)

    def _restore_ahead_steps(self, chat_id: int, scope: Scope) -> Iterator[bool]:
        try:
            yield self.cache.restore_ahead(chat_id, scope) is not None
        except Exception:  # a failed restore is a miss: the turn looks up again
            log.exception("restoring chat %d's KV ahead of its turn failed", chat_id)
            yield False

    def share(self, opening: list[int], scope: Scope) -> bool:
        """Put the KV of opening (a system prompt's fixed head) on disk for scope, on a slot
        free now (never waiting): whether it ran."""
        def steps() -> Iterator[None]:
            self.cache.share(opening)
            yield

        shared, _ = self.scheduler.try_run(steps, scope=scope)
        return shared

    def _runner(self, observe: TurnObserver | None) -> TurnRunner:
        load = self.scheduler.load
        return TurnRunner(self.engine, self.cache, self.prompts, observe,
                          others=lambda: load() != (1, 0))  # (on a slot, waiting): this one

    def reopened(self) -> "ModelRuntime":
        """A new runtime on this one's engine and cache (a switch that failed to load)."""
        return ModelRuntime(self.engine, self.cache, self.limits, self.prompts)

    def close(self) -> None:
        self.engine.close()
