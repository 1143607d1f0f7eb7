"""Warm-up at start: the first user's request should be as fast as the next.

A fresh process pays once for what every later request finds ready: llama.cpp's first decode
and sampling on each slot, its first copy of a KV state out and back in, Python's first pass
through the prompt template and the tokenizer. warm_slots() pays it before the server says it
is ready (GET /health answers "warming_up" meanwhile), on every slot at once, with a prompt of
a scope of its own that nobody's turn can reuse; the slots are emptied afterwards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from .engine import Sampling
from .prompt import Turn

log = logging.getLogger(__name__)

WARM_SCOPE = "warm-up"  # no user's scope: no turn ever reuses this KV
WARM_MESSAGE = "Hello! Please say hello back."
WARM_TOKENS = 4  # sampled per slot


def warm_slots(service) -> float:
    """Run a short turn's steps on every slot of service's engine, at once; the seconds it
    took (0 without a model)."""
    engine, scheduler = service.engine, service.scheduler
    if engine is None or scheduler is None:
        return 0.0
    started = time.perf_counter()
    prompt = service.prompts.tokens(service.defaults.system_prompt,
                                    [Turn("user", WARM_MESSAGE)], WARM_SCOPE)

    def work() -> Iterator[None]:
        service.cache.serve(WARM_SCOPE)  # the slot's KV is nobody's from here
        engine.clear()
        yield from engine.prefill_steps(prompt)
        for _ in engine.generate(Sampling(temperature=0.0), WARM_TOKENS):
            yield
        # A state copied out and back in, as a save and a restore do.
        tokens, batches = list(engine.tokens), list(engine.batches)
        state = bytearray(engine.state())
        engine.restore(tokens, memoryview(state), batches)
        engine.clear()
        yield

    errors: list[BaseException] = []

    def one_slot() -> None:
        try:
            with service.gate.turn():
                scheduler.run(work, scope=WARM_SCOPE)
        except BaseException as exc:  # reported below: a failed warm-up only costs speed
            errors.append(exc)

    threads = [threading.Thread(target=one_slot, name="warm-up") for _ in scheduler.slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        log.warning("the warm-up failed (the first requests may be slower): %s", errors[0])
    return time.perf_counter() - started
