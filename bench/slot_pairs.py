"""What a step of several replies written at once costs, by the slots they are in.

    python -m bench.slot_pairs [--model PATH] [--history 128] [--steps 30] [--runs 3]
                               [--out bench/results/slot_pairs]

Reame's engine gives each slot a KV of its own (llama.cpp sequences in separate streams:
faster than one shared pool, see docs/speed.md). llama.cpp then decodes in one pass only
sequences that are consecutive; the replies of slots 0 and 2 go in two passes. This times one
decode of one token per reply (Engine._decode_rows, what a step of replies written at once
makes) for sets of slots side by side and apart, each slot holding --history tokens, the sets
alternated, medians of --runs runs of --steps decodes. Prints the table; writes
slot_pairs.md, slot_pairs.json and slot_pairs.png to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from reame.inference.engine import Engine

from . import report

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SETS = ((0,), (0, 1), (1, 2), (0, 2), (0, 3), (0, 1, 2), (0, 1, 3), (0, 1, 2, 3))


def step_ms(engine: Engine, slots: tuple[int, ...], steps: int, rng: random.Random) -> float:
    sequences = engine.sequences
    started = time.perf_counter()
    for _ in range(steps):
        engine._decode_rows([(sequences[k], [rng.randrange(100, 20000)], True) for k in slots])
    return (time.perf_counter() - started) / steps * 1000


def side_by_side(slots: tuple[int, ...]) -> bool:
    return all(b - a == 1 for a, b in zip(slots, slots[1:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--history", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: all cores")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "slot_pairs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    needed = args.history + args.runs * args.steps * len(SETS) + 64
    engine = Engine(args.model, n_ctx=256 * -(-needed // 256), slots=4,
                    n_threads=args.threads)
    try:
        for sequence in engine.sequences:
            engine.use(sequence)
            engine.clear()
            engine._decode_rows([(sequence, [rng.randrange(100, 20000)
                                             for _ in range(args.history)], False)])
        times: dict[tuple[int, ...], list[float]] = {s: [] for s in SETS}
        for run in range(args.runs):
            for slots in (SETS if run % 2 == 0 else SETS[::-1]):
                times[slots].append(step_ms(engine, slots, args.steps, rng))
    finally:
        engine.close()
    alone = statistics.median(times[(0,)])
    rows, results = [], []
    for slots, ms in times.items():
        median = statistics.median(ms)
        results.append({"slots": list(slots), "side_by_side": side_by_side(slots),
                        "step_ms": median, "runs_ms": ms})
        rows.append([", ".join(map(str, slots)), "yes" if side_by_side(slots) else "no",
                     f"{median:.1f}", f"{median / alone:.2f}x",
                     f"{len(slots) * 1000 / median:.0f}"])
    text = (f"One step of replies written at once ({args.model.name}, each slot holding "
            f"{args.history} tokens, medians of {args.runs} x {args.steps} decodes; "
            f"{report.load_average()}):\n\n"
            + report.table(["slots", "side by side", "ms a step", "vs one reply",
                            "tokens/s"], rows) + "\n")
    print(text)
    (args.out / "slot_pairs.md").write_text(text)
    (args.out / "slot_pairs.json").write_text(json.dumps(
        {"model": args.model.name, "history": args.history, "steps": args.steps,
         "runs": args.runs, "machine": report.machine_info(), "sets": results}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels = [", ".join(map(str, r["slots"])) for r in results]
    colours = ["tab:green" if r["side_by_side"] else "tab:red" for r in results]
    axis.bar(labels, [r["step_ms"] for r in results], color=colours)
    axis.set_xlabel("slots whose replies are written at once (green: side by side)")
    axis.set_ylabel("ms a step")
    axis.set_title("A step of replies at once, by their slots")
    figure.tight_layout()
    figure.savefig(args.out / "slot_pairs.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
