"""Scenario "batch": 4 replies at once on one engine, their next tokens decoded together (reame's
default) or each on its own ([model] exact_under_load), against one reply alone.

Each of 4 slots holds its own history of plan.batch_history tokens; then plan.batch_steps
greedy tokens are generated for each, three ways, alternated in one run, through the engine's
own generator and Engine.decode_pending (what the scheduler calls after each round):

- alone: one slot's reply by itself;
- exact: the 4 replies, each token decoded on its own (exact_under_load = true);
- together: the 4 replies' tokens in one llama_decode per step (the default).

Aggregate tokens/s for each, and how many replies under load differ from the same reply alone:
a shared decode changes the shapes the kernels see, and so, on some CPUs, the last bits of the
logits; greedy decoding flips where two tokens are nearly tied. Every reply's history is
another stretch of filler, over plan.batch_rounds rounds: 4 x rounds replies compared.
"""

from __future__ import annotations

import time

from reame.inference.engine import Engine
from reame.inference.sampling import Sampling

from .scenarios import Context, _filler_tokens

SLOTS = 4
GREEDY = Sampling(temperature=0.0)
HISTORIES: dict[int, list[int]] = {}  # this round's history of each slot


def batched_vs_in_turn(ctx: Context) -> dict:
    plan = ctx.plan
    history, steps, runs = plan.batch_history, plan.batch_steps, max(1, plan.runs)
    rounds = max(runs, plan.batch_rounds)
    filler = _filler_tokens(ctx, SLOTS * (rounds + 1) * history // 2 + history)
    engine = Engine(ctx.model, n_ctx=history + steps + 64, slots=SLOTS,
                    n_threads=plan.threads)
    try:
        best = {"alone": 0.0, "in turn": 0.0, "batched": 0.0}
        differ, first_diffs, compared = 0, [], 0
        for r in range(rounds):  # the three ways alternate: the machine's drift hits each alike
            # Each round's histories: other stretches of the filler (overlapping halves),
            # evaluated once; each way starts again from their last decode.
            for i, seq in enumerate(engine.sequences):
                start = (r * SLOTS + i) * history // 2
                HISTORIES[i] = filler[start:start + history]
                engine.use(seq)
                engine.clear()
                engine.extend(HISTORIES[i])
            alone = [_replies(engine, [i], steps, together=True) for i in range(SLOTS)]
            rate_alone = SLOTS * steps / sum(seconds for seconds, _ in alone)
            rate_exact, exact = _run(engine, range(SLOTS), steps, together=False)
            rate_together, together = _run(engine, range(SLOTS), steps, together=True)
            if r < runs:
                best["alone"] = max(best["alone"], rate_alone)
                best["in turn"] = max(best["in turn"], rate_exact)
                best["batched"] = max(best["batched"], rate_together)
            for i in range(SLOTS):
                reply_alone = alone[i][1][0]
                assert exact[i] == reply_alone, "exact_under_load must give the reply alone"
                compared += 1
                if together[i] != reply_alone:
                    differ += 1
                    first_diffs.append(next(k for k, (a, b) in enumerate(
                        zip(together[i], reply_alone)) if a != b))
    finally:
        engine.close()
    return {"history": history, "steps": steps, "runs": runs, "slots": SLOTS,
            "tokens_per_s": best,
            "in_turn_vs_alone": best["in turn"] / best["alone"],
            "batched_vs_in_turn": best["batched"] / best["in turn"],
            "replies_compared": compared, "replies_differing": differ,
            "first_difference_at": first_diffs,
            "batched_same_replies": differ == 0, "in_turn_same_as_alone": True}


def _run(engine: Engine, slots, steps: int, together: bool) -> tuple[float, list[list[int]]]:
    seconds, replies = _replies(engine, list(slots), steps, together=together)
    return len(replies) * steps / seconds, replies


def _replies(engine: Engine, slots: list[int], steps: int,
             together: bool) -> tuple[float, list[list[int]]]:
    """Greedy replies of steps tokens after each slot's history, all at once; the seconds
    their tokens after the first took. Each slot's prompt is its history (engine.prefill: the
    history's last decode is evaluated again, the generated tokens dropped)."""
    engine.together = together
    generators, replies = [], []
    for i in slots:
        engine.use(engine.sequences[i])
        engine.prefill(HISTORIES[i])
        generator = engine.generate(GREEDY, steps + 1, queued=True)
        replies.append([_eos_free(next(generator))])
        generators.append((i, generator))
    started = time.perf_counter()
    live = list(range(len(generators)))
    while live:
        for k in list(live):
            i, generator = generators[k]
            engine.use(engine.sequences[i])
            token = next(generator, StopIteration)
            if token is StopIteration:
                live.remove(k)
            elif token is not None:
                replies[k].append(token)
        engine.decode_pending()
    engine.together = True
    return time.perf_counter() - started, replies


def _eos_free(token: int | None) -> int:
    if token is None:
        raise RuntimeError("a reply ended at its first token: use a longer filler")
    return token
