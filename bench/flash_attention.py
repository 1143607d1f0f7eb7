"""Flash attention on and off, by model: what [model] flash_attn = auto decides from.

    python -m bench.flash_attention [--models smollm2,qwen2.5-0.5b,qwen2.5-1.5b] [--runs 3]
                                    [--out bench/results/flash_attention]

For each model, two engines (4 slots), one with llama.cpp's flash attention and one without,
time the same work alternately, medians of --runs runs:

- prompt: an 800-token prompt evaluated in the plan's decodes (Engine.extend), tokens/s;
- reply at 100 / 800: one token decoded after 100 or 800 tokens of history, ms a token;
- 4 replies at once: one token of each of 4 slots holding 100 tokens in one decode, ms a step.

The shapes (qwen2.5-*) are made by bench.make_models if missing. Prints the table; writes
flash_attention.md, .json and .png to --out.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

from reame.inference.engine import Engine
from reame.models.gguf_info import read_gguf_info

from . import by_model, make_models, report
from .anchor import LABELS, MODELS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "flash_attention"
PROMPT, SHORT, STEPS = 800, 100, 24
MEASURES = ("prompt, tokens/s", "reply at 100, ms a token", "reply at 800, ms a token",
            "4 replies at once, ms a step")


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 20000) for _ in range(n)]


def measure(engine: Engine, rng: random.Random) -> dict[str, float]:
    seqs = engine.sequences
    for seq in seqs:
        engine.use(seq)
        engine.clear()
    engine.use(seqs[0])
    started = time.perf_counter()
    engine.extend(tokens(rng, PROMPT))
    out = {MEASURES[0]: PROMPT / (time.perf_counter() - started)}

    def steps(rows) -> float:
        started = time.perf_counter()
        for _ in range(STEPS):
            engine._decode_rows(rows())
        return (time.perf_counter() - started) / STEPS * 1000

    out[MEASURES[2]] = steps(lambda: [(seqs[0], tokens(rng, 1), True)])
    for seq in seqs[1:]:
        engine.use(seq)
        engine.extend(tokens(rng, SHORT))
    out[MEASURES[1]] = steps(lambda: [(seqs[1], tokens(rng, 1), True)])
    out[MEASURES[3]] = steps(lambda: [(seq, tokens(rng, 1), True) for seq in seqs])
    return out


def run_model(name: str, runs: int) -> dict:
    path = MODELS[name]
    if name in make_models.SHAPES:
        make_models.make(make_models.SHAPES[name])  # skipped when already there
    n_ctx = PROMPT + STEPS * runs + 256
    engines = {mode: Engine(path, n_ctx=n_ctx, slots=4, flash_attn=mode)
               for mode in ("false", "true")}
    rng = random.Random(1)
    times: dict[str, dict[str, list[float]]] = {m: {k: [] for k in MEASURES} for m in engines}
    try:
        for run in range(runs):
            for mode in (("false", "true") if run % 2 == 0 else ("true", "false")):
                for key, value in measure(engines[mode], rng).items():
                    times[mode][key].append(value)
    finally:
        for engine in engines.values():
            engine.close()
    medians = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()}
    # >1: flash attention faster.
    gains = {k: (medians["true"][k] / medians["false"][k] if k == MEASURES[0]
                 else medians["false"][k] / medians["true"][k]) for k in MEASURES}
    return {"name": name, "label": LABELS.get(name, name), "file": path.name,
            "head_dim": read_gguf_info(path).head_dim, "runs": times, "medians": medians,
            "gains": gains}


def write(data: dict, out: Path) -> str:
    rows = []
    for model in data["models"]:
        for key in MEASURES:
            off, on = model["medians"]["false"][key], model["medians"]["true"][key]
            rows.append([model["label"], model["head_dim"], key, f"{off:.1f}", f"{on:.1f}",
                         f"{model['gains'][key]:.2f}x"])
    text = (f"Flash attention off and on (`{data['command']}`, {data['date']}; "
            f"{data['machine']['cpu']}, {data['machine']['cores']} cores; {data['load']}; "
            f"medians of {data['runs']} runs, alternated):\n\n"
            + report.table(["model", "head size", "measure", "off", "on",
                            "on vs off (>1: faster)"], rows) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "flash_attention.md").write_text(text)
    (out / "flash_attention.json").write_text(json.dumps(data, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / max(1, len(data["models"]))
    for i, model in enumerate(data["models"]):
        axis.bar([k + i * width for k in range(len(MEASURES))],
                 [model["gains"][key] for key in MEASURES], width,
                 label=f"{model['label']} (heads {model['head_dim']} wide)")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks([k + width * (len(data["models"]) - 1) / 2 for k in range(len(MEASURES))],
                    [key.split(",")[0] for key in MEASURES])
    axis.set_ylabel("flash attention on vs off (>1: faster)")
    axis.set_title("llama.cpp's flash attention on this CPU, by model")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "flash_attention.png", dpi=110)
    return text


def main(argv: list[str] | None = None) -> int:
    return by_model.main(argv, module="bench.flash_attention", doc=__doc__, models="smollm2,qwen2.5-0.5b,qwen2.5-1.5b",
                         runs=3, out=OUT, run_model=run_model, write=write)


if __name__ == "__main__":
    sys.exit(main())
