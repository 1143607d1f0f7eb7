"""The plan's first chunks: what boundaries below CHUNK cost a cold prompt, by model.

    python -m bench.first_chunks [--models smollm2,qwen2.5-1.5b] [--runs 5]
                                 [--out bench/results/first_chunks]

A prompt's chunk boundaries below batches.CHUNK decide how much of a shared opening (a chat
template's header, a system prompt) another prompt can reuse, and cost every cold prompt a
decode each. For each model, one engine evaluates new prompts of 80, 128 and 800 tokens after
a first chunk of 16 (the opening a prompt usually finds live), under each set of boundaries,
alternated, medians of --runs runs:

- 16, 32, 64 (the ramp of 2026-12-04, cba69c8), 16, 64 (today's plan), 16: a boundary less
  each, then every CHUNK.

Prints the table (ms, and the speed against 16, 32, 64); writes first_chunks.md, .json and
.png to --out.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

from reame.inference import batches
from reame.inference.engine import Engine

from . import by_model, make_models, report
from .anchor import LABELS, MODELS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "first_chunks"
LENGTHS = (80, 128, 800)
RAMPS = {"16, 32, 64": (16, 32, 64), "16, 64": (16, 64), "16": (16,)}
BASE = "16, 32, 64"


def evaluate(engine: Engine, prompt: list[int], ramp: tuple[int, ...]) -> float:
    """Seconds to evaluate prompt after its first 16 tokens, in the decodes ramp's plan makes."""
    engine.clear()
    engine.extend(prompt[:16])
    with mock.patch.object(batches, "RAMP", ramp):
        started = time.perf_counter()
        engine.extend(prompt[16:])
        return time.perf_counter() - started


def run_model(name: str, runs: int) -> dict:
    path = MODELS[name]
    if name in make_models.SHAPES:
        make_models.make(make_models.SHAPES[name])  # skipped when already there
    engine = Engine(path, n_ctx=max(LENGTHS) + 64)
    rng = random.Random(1)
    times = {str(n): {ramp: [] for ramp in RAMPS} for n in LENGTHS}
    try:
        for run in range(runs):
            for n in LENGTHS:
                prompt = [rng.randrange(100, 20000) for _ in range(n)]
                order = list(RAMPS) if run % 2 == 0 else list(RAMPS)[::-1]
                for ramp in order:
                    times[str(n)][ramp].append(evaluate(engine, prompt, RAMPS[ramp]))
    finally:
        engine.close()
    medians = {n: {r: statistics.median(v) for r, v in t.items()} for n, t in times.items()}
    return {"name": name, "label": LABELS.get(name, name), "file": path.name, "runs": times,
            "medians": medians,
            "speed": {n: {r: m[BASE] / m[r] for r in RAMPS} for n, m in medians.items()}}


def write(data: dict, out: Path) -> str:
    rows = []
    for model in data["models"]:
        for n in map(str, LENGTHS):
            rows.append([model["label"], n, *(f"{model['medians'][n][r] * 1000:.0f}"
                                              for r in RAMPS),
                         *(f"{model['speed'][n][r]:.2f}x" for r in RAMPS if r != BASE)])
    text = (f"A new prompt's evaluation after its first 16 tokens, by the boundaries below "
            f"CHUNK (`{data['command']}`, {data['date']}; {data['machine']['cpu']}, "
            f"{data['machine']['cores']} cores; {data['load']}; medians of {data['runs']} runs, "
            "alternated; ms, and the speed against 16, 32, 64):\n\n"
            + report.table(["model", "prompt tokens", *(f"{r}, ms" for r in RAMPS),
                            *(f"{r} vs {BASE}" for r in RAMPS if r != BASE)], rows) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_chunks.md").write_text(text)
    (out / "first_chunks.json").write_text(json.dumps(data, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(8, 3.8))
    bars = [(model, r) for model in data["models"] for r in RAMPS if r != BASE]
    width = 0.8 / len(bars)
    for i, (model, r) in enumerate(bars):
        axis.bar([k + i * width for k in range(len(LENGTHS))],
                 [model["speed"][str(n)][r] for n in LENGTHS], width,
                 label=f"{model['label']}: boundaries {r}")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks([k + width * (len(bars) - 1) / 2 for k in range(len(LENGTHS))],
                    [f"{n}-token prompt" for n in LENGTHS])
    axis.set_ylabel(f"speed vs boundaries {BASE} (>1: faster)")
    axis.set_title("A cold prompt's evaluation by its first chunks")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "first_chunks.png", dpi=110)
    return text


def main(argv: list[str] | None = None) -> int:
    return by_model.main(argv, module="bench.first_chunks", doc=__doc__, models="smollm2,qwen2.5-1.5b",
                         runs=5, out=OUT, run_model=run_model, write=write)


if __name__ == "__main__":
    sys.exit(main())
