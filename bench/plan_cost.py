"""Scenario "plan": what the batch plan (reame/inference/batches.py) costs, side by side in one run.

Every prompt is evaluated in chunks at absolute positions (batches.plan), so that the reply
never depends on what the cache held. Before, the new tokens of a turn
went in one decode. Measured on the same engine, alternating the two ways, for:

- a turn: a new message (and the reply header) on top of a history already in the KV: the
  time until the first token's logits are there, the part of the first token the plan touches;
- a cold prompt of the same length as the history: one decode per 512 tokens vs the plan.
"""

from __future__ import annotations

import statistics
import time

import llama_cpp

from reame.inference.batches import CHUNK
from reame.inference.engine import Engine

from .scenarios import Context, _filler_tokens

NEW_TOKENS = 21  # a 16-token message and the reply header (ChatML)
OLD_BATCH = 512  # Engine's n_batch: what one decode took before the plan


def batch_plan_cost(ctx: Context) -> dict:
    sizes = ctx.plan.sizes if not ctx.plan.quick else (250, 2000)
    runs = max(3, ctx.plan.runs)
    longest = max(sizes)
    tokens = _filler_tokens(ctx, longest + NEW_TOKENS + 1)
    engine = Engine(ctx.model, n_ctx=longest + 256, n_threads=ctx.plan.threads)
    rows = []
    try:
        for size in sizes:
            history, new = tokens[:size], tokens[size:size + NEW_TOKENS]
            engine.clear()
            engine.extend(history)
            one, planned = _alternate(engine, runs, lambda: engine.truncate(size), new)
            cold_runs = max(1, runs // 3) if size > 1000 else runs
            cold_one, cold_plan = _alternate(engine, cold_runs, engine.clear,
                                             tokens[:size + 1])
            rows.append({"history": size, "new_tokens": NEW_TOKENS,
                         "turn_one_ms": one * 1000, "turn_plan_ms": planned * 1000,
                         "turn_added_ms": (planned - one) * 1000,
                         "cold_one_s": cold_one, "cold_plan_s": cold_plan,
                         "cold_ratio": cold_plan / cold_one})
    finally:
        engine.close()
    return {"rows": rows, "chunk": CHUNK, "runs": runs}


def _alternate(engine: Engine, runs: int, prepare, tokens: list[int]) -> tuple[float, float]:
    """Median seconds to evaluate tokens after prepare(): one decode, then the plan, in turns."""
    times: dict[str, list[float]] = {"one decode": [], "plan": []}
    for _ in range(runs):
        for way, seconds in times.items():
            prepare()
            started = time.perf_counter()
            if way == "plan":
                engine.extend(tokens)
            else:
                _one_way(engine, tokens)
            seconds.append(time.perf_counter() - started)
            if way != "plan":  # the engine does not know of these decodes: undo them
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(engine.context),
                                              engine.seq.id, len(engine.tokens), -1)
    return statistics.median(times["one decode"]), statistics.median(times["plan"])


def _one_way(engine: Engine, tokens: list[int]) -> None:
    """The evaluation before the plan: up to OLD_BATCH tokens per decode, straight through
    llama.cpp (the engine's own decodes take at most a plan's chunk)."""
    batch = llama_cpp.llama_batch_init(OLD_BATCH, 0, 1)
    try:
        base = len(engine.tokens)
        for start in range(0, len(tokens), OLD_BATCH):
            part = tokens[start:start + OLD_BATCH]
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, base + start + i, 1
                batch.seq_id[i][0] = engine.seq.id
                batch.logits[i] = i == len(part) - 1
            batch.n_tokens = len(part)
            if llama_cpp.llama_decode(engine.context, batch) != 0:
                raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)
