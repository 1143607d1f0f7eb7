"""Warm-up at start: the first user's request should be as fast as the next.

A fresh process pays once for what every later request finds ready. (Gradio's first API call
used to import matplotlib for a backend switch around every call, 0.8 s to that call's first
token against 0.3 s for the next, `python -m bench.warmup`:
reame/web/gradio_api/gradio_import.py now replaces that switch by nothing.)

warm_model() runs a short turn's steps on one slot (llama.cpp's first decode reads the model
file's pages, which after a reboot are not in memory yet; its first sampling and its first copy
of a KV state out and back in), with a scope of its own that nobody's turn can reuse; the slot
is emptied afterwards. GET /health answers "warming_up" until the model is warm.

settle_objects() then sets the start-up's objects aside from the garbage collector: without it
the first turn could pay a full collection of the millions of objects the imports made (0.5-0.9
s to its first token). The app keeps the collector off while it starts (nothing it makes is
garbage; the imports alone ran 0.3 s faster without it) and turns it on there.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator

from reame.inference.prompt import PromptMessage
from reame.inference.sampling import Sampling
from reame.inference.scope import Scope

log = logging.getLogger(__name__)

WARM_SCOPE = Scope("warm-up")  # no user's scope: no turn ever reuses this KV
WARM_MESSAGE = "Hello! Please say hello back."
WARM_TOKENS = 4  # sampled per slot


def settle_objects() -> None:
    """Collect once, freeze what is left out of later collections' reach (it lives as long as
    the process), and turn the collector on (the app starts with it off)."""
    gc.collect()
    gc.freeze()
    gc.enable()


def warm_model(service) -> float:
    """Run a short turn's steps on one slot of service's engine; the seconds it took (0
    without a model)."""
    if service.runtime is None:
        return 0.0
    started = time.perf_counter()
    try:
        with service.using_model() as runtime:
            runtime.warm(service.defaults.system_prompt)
    except Exception as exc:  # a failed warm-up only costs speed
        log.warning("the warm-up failed (the first request may be slower): %s", exc)
    return time.perf_counter() - started


def warm_runtime(runtime, system_prompt: str) -> None:
    """A short turn's steps on one slot of runtime's engine, and a state copied out and back."""
    engine = runtime.engine
    prompt = runtime.prompts.tokens(system_prompt, [PromptMessage("user", WARM_MESSAGE)],
                                    WARM_SCOPE)

    def work() -> Iterator[None]:
        runtime.cache.serve(WARM_SCOPE)  # the slot's KV is nobody's from here
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

    runtime.scheduler.run(work, scope=WARM_SCOPE)
