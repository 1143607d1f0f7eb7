"""The engine in a process of its own, against the engine in the caller's process: what it costs.

    python -m bench.engine_process [--models smollm2,qwen2.5-1.5b] [--runs 5] [--threads 1]
                                   [--out bench/results/engine_process]

A fatal llama.cpp error (GGML_ABORT, a C++ exception crossing the C API) ends the process it
happens in. With the engine in a child process (as vLLM's engine core is), such a crash would
end one turn and restart the model while the web process lives on. For each model, in one run,
alternated run by run, medians of --runs runs:

- **in-process**: `Engine(model, n_ctx, n_threads)` in this process; each turn clears the KV,
  evaluates a new prompt of 800 tokens (`engine.prefill`) and writes a reply of 128 tokens
  (`engine.generate(Sampling(temperature=0))`, the end tokens banned so that every reply is 128
  tokens long), each token turned into text (`engine.text_stream()`) as the server does;
- **out-of-process**: the same Engine in a child process (multiprocessing, "spawn" context;
  --start-method forkserver to compare), driven over a multiprocessing Pipe: the parent sends
  the prompt's tokens, the child answers with one message per token (its text), and the parent
  times the same things on its side.

Measured: the first token (from the call, or the message sent, to the first token's text in
hand: prompt evaluation + first sample), the time per token of the reply (first to last
token's text, over 127), the in-process model load (`Engine(...)`) against the child's
start-up (process start, imports, model load, until it answers), and a crash: the child
killed with SIGKILL 16 tokens into a reply, the time until the parent sees it (EOF on the pipe)
and until a new child answers again (the restart, what a crash costs everyone else), then the
first token of the first turn after a (re)load in both. Both variants run one warm-up turn
first, not counted, and after each (re)load. Both replies are checked to be the same text.

The machine may be shared: --threads (default 1) is the engine's n_threads in both variants.
Prints the table; writes engine_process.md, .json and .png to --out, with the date and the git
commit measured at.

The imports at the top are the child's too (spawn runs this module again in the child): keep
them to what an engine process needs; the report's are imported where they are used.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reame.inference.engine import Engine
from reame.inference.sampling import Sampling

from .workload import paragraph

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "engine_process"
PROMPT, REPLY, KILL_AFTER = 800, 128, 16
N_CTX = 1024
VARIANTS = ("in-process", "out-of-process")


# one turn, the same code in both variants


def turn(engine: Engine, prompt: list[int], sampling: Sampling, emit) -> dict:
    """Evaluate prompt from an empty KV and write REPLY tokens, emit(text) for each; the
    engine's own times (s): first token, time per token after it."""
    started = time.perf_counter()
    engine.clear()
    engine.prefill(prompt)
    stream = engine.text_stream()
    stamps, emitting = [], []
    for token in engine.generate(sampling, REPLY):
        text = stream.push(token)
        before = time.perf_counter()
        emit(text)
        stamps.append(time.perf_counter())
        emitting.append(stamps[-1] - before)
    return {"first_s": stamps[0] - started,
            "per_token_s": (stamps[-1] - stamps[0]) / (len(stamps) - 1), "tokens": len(stamps),
            "emit_s": statistics.mean(emitting), "emit_median_s": statistics.median(emitting),
            "emit_max_s": max(emitting)}


# the child: an engine process


def serve(conn, model_path: str, n_ctx: int, n_threads: int) -> None:
    """The child's loop: load the model, say so, then answer turns (one message per token)."""
    loading = time.perf_counter()
    engine = Engine(Path(model_path), n_ctx=n_ctx, n_threads=n_threads)
    conn.send(("ready", time.perf_counter() - loading, os.getpid()))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message[0] == "turn":
            _, prompt, sampling = message
            # perf_counter is CLOCK_MONOTONIC, one clock for both processes: the parent
            # reads each message's latency from the time it was sent.
            own = turn(engine, prompt, sampling,
                       lambda text: conn.send(("token", text, time.perf_counter())))
            conn.send(("done", own))
        elif message[0] == "ping":
            conn.send(("pong",))
        else:
            break
    engine.close()


class Child:
    """An engine process and the parent's end of its pipe."""

    def __init__(self, context, model_path: Path, n_ctx: int, n_threads: int):
        started = time.perf_counter()
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs, str(model_path), n_ctx,
                                                           n_threads), daemon=True)
        self.process.start()
        theirs.close()  # else the parent never sees EOF when the child dies
        kind, self.load_s, self.pid = self.conn.recv()
        assert kind == "ready"
        self.start_s = time.perf_counter() - started

    def turn(self, prompt: list[int], sampling: Sampling, stop_after: int | None = None) -> dict:
        """One turn seen from the parent: its own times, the child's, the reply's text. With
        stop_after, kill the child with SIGKILL once that many tokens arrived: the time until
        the pipe says it is gone."""
        texts, stamps, latencies = [], [], []
        started = time.perf_counter()
        self.conn.send(("turn", prompt, sampling))
        while True:
            message = self.conn.recv()
            if message[0] == "done":
                break
            stamps.append(time.perf_counter())
            texts.append(message[1])
            latencies.append(stamps[-1] - message[2])
            if stop_after is not None and len(stamps) == stop_after:
                return {"detect_s": self.kill()}
        return {"first_s": stamps[0] - started,
                "per_token_s": (stamps[-1] - stamps[0]) / (len(stamps) - 1),
                "tokens": len(stamps), "text": "".join(texts), "child": message[1],
                "latency_s": statistics.median(latencies)}

    def kill(self) -> float:
        """SIGKILL the child; seconds until its pipe ends (the messages already sent read)."""
        killed = time.perf_counter()
        os.kill(self.pid, signal.SIGKILL)
        try:
            while True:
                self.conn.recv()
        except (EOFError, ConnectionError):
            detected = time.perf_counter() - killed
        self.process.join()
        self.conn.close()
        self.killed_at = killed
        return detected

    def rss_mb(self) -> float | None:
        try:
            import psutil
            return psutil.Process(self.pid).memory_info().rss / 2**20
        except Exception:
            return None

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(timeout=30)
        self.conn.close()


# the parent


def in_process_turn(engine: Engine, prompt: list[int], sampling: Sampling) -> dict:
    texts = []
    out = turn(engine, prompt, sampling, texts.append)
    return {**out, "text": "".join(texts)}


def new_prompt(engine: Engine, rng: random.Random) -> list[int]:
    text = "Continue this story. " + paragraph(rng, PROMPT)
    tokens = engine.tokenize(text, add_bos=engine.adds_bos)
    assert len(tokens) >= PROMPT, len(tokens)
    return tokens[:PROMPT]


def run_model(name: str, runs: int, threads: int, start_method: str) -> dict:
    from . import make_models
    from .anchor import LABELS, MODELS

    path = MODELS[name]
    if name in make_models.SHAPES:
        make_models.make(make_models.SHAPES[name])  # skipped when already there
    context = multiprocessing.get_context(start_method)
    rng = random.Random(1)
    data = {v: {"first_ms": [], "per_token_ms": [], "load_s": [], "cold_first_ms": []}
            for v in VARIANTS}
    out = data["out-of-process"]
    out.update({"child_first_ms": [], "child_per_token_ms": [], "send_us": [], "send_median_us": [],
                "latency_us": [], "child_load_s": [],
                "detect_ms": [], "restart_s": []})
    same: list[bool] = []
    started = time.perf_counter()
    engine = Engine(path, n_ctx=N_CTX, n_threads=threads)
    first_load = {"in-process": time.perf_counter() - started, "out-of-process": None}
    child = Child(context, path, N_CTX, threads)
    first_load["out-of-process"] = child.start_s
    # Every end token banned: 128 tokens each time, the same for both.
    sampling = Sampling(temperature=0, logit_bias=tuple(
        (t, -100.0) for t in range(engine.n_vocab) if engine.is_end(t)))
    try:
        warm = new_prompt(engine, rng)
        in_process_turn(engine, warm, sampling)
        child.turn(warm, sampling)

        # Turns, alternated.
        for run in range(runs):
            prompt = new_prompt(engine, rng)
            texts = {}
            for variant in VARIANTS if run % 2 == 0 else VARIANTS[::-1]:
                if variant == "in-process":
                    result = in_process_turn(engine, prompt, sampling)
                else:
                    result = child.turn(prompt, sampling)
                    out["child_first_ms"].append(result["child"]["first_s"] * 1000)
                    out["child_per_token_ms"].append(result["child"]["per_token_s"] * 1000)
                    out["send_us"].append(result["child"]["emit_s"] * 1e6)
                    out["send_median_us"].append(result["child"]["emit_median_s"] * 1e6)
                    out["latency_us"].append(result["latency_s"] * 1e6)
                assert result["tokens"] == REPLY, result["tokens"]
                data[variant]["first_ms"].append(result["first_s"] * 1000)
                data[variant]["per_token_ms"].append(result["per_token_s"] * 1000)
                texts[variant] = result["text"]
            same.append(texts["in-process"] == texts["out-of-process"])
            print(f"  {name} run {run + 1}/{runs}: first token "
                  f"{data['in-process']['first_ms'][-1]:.0f} / "
                  f"{out['first_ms'][-1]:.0f} ms, per token "
                  f"{data['in-process']['per_token_ms'][-1]:.2f} / "
                  f"{out['per_token_ms'][-1]:.2f} ms (in / out)", file=sys.stderr)
        rss_mb = child.rss_mb()

        # Loads and crashes, alternated: a new Engine here; the child killed mid-reply and
        # started again. Then the first turn after each (re)load.
        for run in range(runs):
            prompt = new_prompt(engine, rng)
            for variant in VARIANTS if run % 2 == 0 else VARIANTS[::-1]:
                if variant == "in-process":
                    engine.close()
                    loading = time.perf_counter()
                    engine = Engine(path, n_ctx=N_CTX, n_threads=threads)
                    data[variant]["load_s"].append(time.perf_counter() - loading)
                    result = in_process_turn(engine, prompt, sampling)
                else:
                    out["detect_ms"].append(child.turn(prompt, sampling,
                                                       stop_after=KILL_AFTER)["detect_s"] * 1000)
                    killed_at = child.killed_at
                    child = Child(context, path, N_CTX, threads)
                    out["restart_s"].append(time.perf_counter() - killed_at)
                    out["load_s"].append(child.start_s)
                    out["child_load_s"].append(child.load_s)
                    result = child.turn(prompt, sampling)
                data[variant]["cold_first_ms"].append(result["first_s"] * 1000)
            print(f"  {name} (re)load {run + 1}/{runs}: load {data['in-process']['load_s'][-1]:.2f}"
                  f" s / child start-up {out['load_s'][-1]:.2f} s, restart after SIGKILL "
                  f"{out['restart_s'][-1]:.2f} s", file=sys.stderr)
    finally:
        engine.close()
        child.close()
    medians = {v: {k: statistics.median(x) for k, x in d.items() if x} for v, d in data.items()}
    return {"name": name, "label": LABELS.get(name, name), "file": path.name,
            "first_load": first_load, "child_rss_mb": rss_mb, "same_reply": same,
            "runs": data, "medians": medians, "wall_s": round(time.perf_counter() - started, 1)}


# the report


def rows(model: dict) -> list[list[str]]:
    med_in, med_out = model["medians"]["in-process"], model["medians"]["out-of-process"]

    def row(label: str, key: str, fmt: str, out_key: str | None = None) -> list[str]:
        a, b = med_in[key], med_out[out_key or key]
        return [model["label"], label, format(a, fmt), format(b, fmt), f"{b / a:.3f}"]

    return [
        row(f"first token, {PROMPT}-token prompt (ms)", "first_ms", ",.1f"),
        row(f"per token, {REPLY}-token reply (ms)", "per_token_ms", ".3f"),
        row("first token after a (re)load (ms)", "cold_first_ms", ",.1f"),
        row("load in-process / child start-up (s)", "load_s", ".2f"),
        [model["label"], "SIGKILL seen by the parent (ms)", "-",
         f"{med_out['detect_ms']:.2f}", "-"],
        [model["label"], "restart after SIGKILL, until it answers (s)", "-",
         f"{med_out['restart_s']:.2f}", "-"],
    ]


def write(data: dict, out: Path) -> str:
    import json

    from . import report

    headers = ["model", "measure", "in-process", "out-of-process", "out / in"]
    notes = []
    for model in data["models"]:
        m = model["medians"]["out-of-process"]
        notes.append(
            f"- {model['label']}: inside the child the engine took {m['child_first_ms']:,.1f} ms "
            f"to the first token and {m['child_per_token_ms']:.3f} ms a token (the pipe adds "
            f"{m['first_ms'] - m['child_first_ms']:.2f} ms to the first); sending a token's "
            f"message took the child {m['send_median_us']:.0f} µs (median; {m['send_us']:.0f} µs "
            f"on average, which the time per token includes), and it reached the parent "
            f"{m['latency_us']:.0f} µs after it was sent (median); of the child's start-up "
            f"{m['load_s']:.2f} s, {m['child_load_s']:.2f} s is `Engine(...)`, the rest the "
            f"process start and imports; the child's RSS {model['child_rss_mb']:.0f} MB; "
            f"same reply text in both: {sum(model['same_reply'])} of "
            f"{len(model['same_reply'])} runs.")
    text = (f"The engine in a child process against the engine in the caller's process "
            f"(`{data['command']}`, {data['date']}, commit {data['commit']}; "
            f"{data['machine']['cpu']}, {data['machine']['cores']} cores; load "
            f"{data['load']} at the start, {data['load_end']} at the end; n_threads "
            f"{data['threads']} in both; start method {data['start_method']}; medians of "
            f"{data['runs']} runs, alternated; out / in above 1: the child is slower):\n\n"
            + report.table(headers, [r for model in data["models"] for r in rows(model)])
            + "\n\n" + "\n".join(notes) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_process.md").write_text(text)
    (out / "engine_process.json").write_text(json.dumps(data, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measures = [("first_ms", "first token"), ("per_token_ms", "per token"),
                ("cold_first_ms", "first token\nafter a (re)load"),
                ("load_s", "load / start-up")]
    figure, axis = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / max(1, len(data["models"]))
    for i, model in enumerate(data["models"]):
        med_in, med_out = model["medians"]["in-process"], model["medians"]["out-of-process"]
        axis.bar([k + i * width for k in range(len(measures))],
                 [med_out[key] / med_in[key] for key, _ in measures], width,
                 label=model["label"])
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.axhline(1.05, color="grey", linewidth=0.8, linestyle="--", label="+5 %")
    axis.set_xticks([k + width * (len(data["models"]) - 1) / 2 for k in range(len(measures))],
                    [label for _, label in measures])
    axis.set_ylabel("out-of-process / in-process (>1: slower)")
    axis.set_title("The engine in a child process: what it costs")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "engine_process.png", dpi=110)
    return text


def commit() -> str:
    """HEAD's short id, and "+changes" if the engine's code differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (" (+uncommitted changes in reame/inference)"
                   if git("status", "--porcelain", "reame/inference").strip() else "")


def main(argv: list[str] | None = None) -> int:
    from . import report
    from .anchor import MODELS

    parser = argparse.ArgumentParser(prog="python -m bench.engine_process",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2,qwen2.5-1.5b")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="the engine's n_threads in both variants (default 1)")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default="spawn")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = set(names) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}: pick from "
                     f"{', '.join(MODELS)}")
    data = {"command": "python -m bench.engine_process "
                       + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
            "machine": report.machine_info(), "load": report.load_average(),
            "runs": args.runs, "threads": args.threads, "start_method": args.start_method,
            "prompt_tokens": PROMPT, "reply_tokens": REPLY, "n_ctx": N_CTX}
    data["models"] = [run_model(name, args.runs, args.threads, args.start_method)
                      for name in names]
    data["load_end"] = report.load_average()
    print(write(data, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
