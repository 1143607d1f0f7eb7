"""Scenario "batch": 4 replies at once on one engine, their decode steps taken in turn (what
reame does) or batched into one llama_decode (what it does not), against one reply alone.

Each of 4 slots holds its own history of plan.batch_history tokens; then plan.batch_steps
greedy tokens are generated for each, three ways, in one run:

- alone: one slot's reply by itself, one decode per token;
- in turn: the 4 replies, one decode each per step (reame's scheduler);
- batched: the 4 replies' tokens in one llama_decode per step (one token per sequence).

Aggregate tokens/s for each, and whether the batched replies are the replies in turn, token for
token: batching changes the shapes the kernels see, and so, on some CPUs, the last bits.
"""

from __future__ import annotations

import time

import llama_cpp
import numpy

from reame.inference.engine import Engine

from .scenarios import Context, _filler_tokens

SLOTS = 4


def batched_vs_in_turn(ctx: Context) -> dict:
    plan = ctx.plan
    history, steps, runs = plan.batch_history, plan.batch_steps, max(1, plan.runs)
    filler = _filler_tokens(ctx, SLOTS * history)
    engine = Engine(ctx.model, n_ctx=history + steps + 64, slots=SLOTS,
                    n_threads=plan.threads)
    try:
        for i, seq in enumerate(engine.sequences):
            engine.use(seq)
            engine.extend(filler[i * history:(i + 1) * history])
        best = {"alone": 0.0, "in turn": 0.0, "batched": 0.0}
        replies = {}
        for _ in range(runs):  # the three ways alternate: the machine's drift hits each alike
            for way, fn in (("alone", _alone), ("in turn", _in_turn), ("batched", _batched)):
                rate, replies[way] = fn(engine, history, steps)
                best[way] = max(best[way], rate)
    finally:
        engine.close()
    return {"history": history, "steps": steps, "runs": runs, "slots": SLOTS,
            "tokens_per_s": best,
            "in_turn_vs_alone": best["in turn"] / best["alone"],
            "batched_vs_in_turn": best["batched"] / best["in turn"],
            "batched_same_replies": replies["batched"] == replies["in turn"],
            "in_turn_same_as_alone": replies["in turn"][0] == replies["alone"][0]}


def _greedy(engine: Engine, index: int = -1) -> int:
    ptr = llama_cpp.llama_get_logits_ith(engine.context, index)
    return int(numpy.ctypeslib.as_array(ptr, shape=(engine.n_vocab,)).argmax())


def _reset(engine: Engine, history: int) -> None:
    """Every slot back to its history (the generated tokens' KV dropped)."""
    mem = llama_cpp.llama_get_memory(engine.context)
    for seq in engine.sequences:
        llama_cpp.llama_memory_seq_rm(mem, seq.id, history, -1)
        engine.use(seq)
        engine.truncate(history)


def _first_tokens(engine: Engine, history: int) -> list[int]:
    """Each slot's first token: its history's last token evaluated again, alone."""
    firsts = []
    for seq in engine.sequences:
        engine.use(seq)
        tokens = list(seq.tokens)
        engine.truncate(history - 1)  # to the start of its last decode: the plan's own
        engine.extend(tokens[len(seq.tokens):history])
        firsts.append(_greedy(engine))
    return firsts


def _alone(engine: Engine, history: int, steps: int) -> tuple[float, list[list[int]]]:
    _reset(engine, history)
    token = _first_tokens(engine, history)[0]
    engine.use(engine.sequences[0])
    reply, started = [token], time.perf_counter()
    for _ in range(steps):
        engine.extend([reply[-1]])
        reply.append(_greedy(engine))
    return steps / (time.perf_counter() - started), [reply]


def _in_turn(engine: Engine, history: int, steps: int) -> tuple[float, list[list[int]]]:
    _reset(engine, history)
    replies = [[t] for t in _first_tokens(engine, history)]
    started = time.perf_counter()
    for _ in range(steps):
        for seq, reply in zip(engine.sequences, replies):
            engine.use(seq)
            engine.extend([reply[-1]])
            reply.append(_greedy(engine))
    return SLOTS * steps / (time.perf_counter() - started), replies


def _batched(engine: Engine, history: int, steps: int) -> tuple[float, list[list[int]]]:
    _reset(engine, history)
    replies = [[t] for t in _first_tokens(engine, history)]
    batch = llama_cpp.llama_batch_init(SLOTS, 0, 1)
    try:
        started = time.perf_counter()
        for step in range(steps):
            for i, (seq, reply) in enumerate(zip(engine.sequences, replies)):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = reply[-1], history + step, 1
                batch.seq_id[i][0] = seq.id
                batch.logits[i] = True
            batch.n_tokens = SLOTS
            if llama_cpp.llama_decode(engine.context, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i, reply in enumerate(replies):
                reply.append(_greedy(engine, i))
        rate = SLOTS * steps / (time.perf_counter() - started)
    finally:
        llama_cpp.llama_batch_free(batch)
    # The engine did not see these decodes: their KV goes behind its back.
    mem = llama_cpp.llama_get_memory(engine.context)
    for seq in engine.sequences:
        llama_cpp.llama_memory_seq_rm(mem, seq.id, history, -1)
    return rate, replies
