"""The loaded model and everything made for it, replaced as one thing at a model switch.

A ModelRuntime holds the engine, its KV cache, its prompt builder and its scheduler. A turn takes
the service's current runtime once and uses only it: a switch installs a new runtime in one
step, and the old one is retired: its turns under way are stopped at their next step (each
keeps what it wrote), the turns still waiting for a slot are told to go to the new runtime
(Replaced), and its engine is closed only once no thread uses it. A thread that uses the engine
outside the scheduler (tokenizing a prompt) holds a lease meanwhile; leases are held for
straight-line code only, never across a yield, so no caller that goes away can keep one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.prompt import PromptBuilder
from reame.inference.scheduler import Scheduler
from reame.inference.tasks import Limits, Replaced


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

    def reopened(self) -> "ModelRuntime":
        """A new runtime on this one's engine and cache (a switch that failed to load)."""
        return ModelRuntime(self.engine, self.cache, self.limits, self.prompts)

    def close(self) -> None:
        self.engine.close()
