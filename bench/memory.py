"""Memory of a real Reame server, against the Settings tab's estimate (catalog.memory_needed).

    python -m bench.memory [--models smollm2,qwen2.5-0.5b,qwen2.5-1.5b] [--n-ctx 4096,8192]
                           [--kv-types f16,q8_0] [--out bench/results/memory]
    python -m bench.memory --load-modes [--models smollm2,qwen2.5-1.5b]
    python -m bench.memory --report-only bench/results/memory/results.json

For each model, n_ctx and KV type, starts `python app.py` (bench/servers.py) with reame.conf's
default slots and kv_ram_mb and one thread, and reads the resident memory (RSS) of its process
with psutil: at idle (GET /health answers 200, then a short pause) and while answering (sampled
every 50 ms, and the kernel's high-water mark VmHWM reset before the request, from a streamed
stateless /v1/chat/completions whose prompt fills half of n_ctx with filler, max_tokens 64, until
2 s after the reply: the KV file is copied out then). One run per configuration: memory does not
vary with the machine's load as timings do. The estimate, and its error against the peak, are
computed from the model file's header facts recorded in results.json, so --report-only (and
tests/inference/test_memory_estimate.py) recompute them without the files.

--load-modes measures only each model's idle server in both of [model] mmap's ways of loading
the weights, mapped (true) and read into memory (false), and how long the engine takes to load
it each way (the median of LOAD_RUNS loads in fresh processes, the file in the page cache); it
keeps the other rows of the results.json it writes into.

Models: the default SmolLM2-135M (models/) and the random-weight Qwen2.5 shapes of
bench/make_models.py (bench/cache/, gitignored; made there if missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

from reame.config.reame_conf import SETTINGS
from reame.models.catalog import memory_needed
from reame.models.gguf_info import GGUFInfo, read_gguf_info
from reame.models.kv_budget import slots_that_fit
from reame.models.repack import Weights, cpu_features, cpu_repacks, plan_weights

from . import make_models, servers, users, workload

log = logging.getLogger("bench.memory")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = {"smollm2": DEFAULT_MODEL,
          **{name: make_models.output_path(shape) for name, shape in make_models.SHAPES.items()}}
LABELS = {"smollm2": "SmolLM2-135M Q4_1", "qwen2.5-0.5b": "Qwen2.5-0.5B shape Q4_K_M",
          "qwen2.5-1.5b": "Qwen2.5-1.5B shape Q4_K_M"}
MB = 2**20
SAMPLE_S = 0.05  # RSS sampling period while answering
SETTLE_S = 2.0  # after /health answers, before the idle reading
TAIL_S = 2.0  # after the reply: the KV file is copied out of llama.cpp and written
MAX_TOKENS = 64
TOLERANCE = 0.15  # the estimate must be within this of the measured peak
LOAD_RUNS = 5  # engine loads per model and way of loading (--load-modes), the median kept
LOAD_MODES = ("true", "false")  # [model] mmap: mapped, read into memory
SYSTEM = "You are a helpful assistant."


def default(section: str, key: str):
    """reame.conf's default for a setting (what a fresh install runs with)."""
    return next(s.default for s in SETTINGS if (s.section, s.key) == (section, key))


def header_facts(info: GGUFInfo) -> dict:
    """What the estimate reads from a model file's header: every GGUFInfo field but the path
    (tests rebuild the GGUFInfo from it without the file)."""
    facts = dataclasses.asdict(info)
    del facts["path"]
    return facts


def info_from(row: dict) -> GGUFInfo:
    return GGUFInfo(path=Path(row["file"]), **row["header"])


def weights_of(row: dict, features: dict) -> Weights:
    """How the row's server held its weights: its [model] mmap on the machine that measured
    it (features: its llama.cpp's CPU features, repack.cpu_features())."""
    return plan_weights(info_from(row), row.get("mmap", "auto"), features)


def estimate(row: dict, features: dict) -> int:
    """memory_needed for a row, as on the machine that measured it."""
    return memory_needed(info_from(row), row["n_ctx"], row["kv_type"], row["slots"],
                         weights=weights_of(row, features))


# measuring


class Sampler:
    """A process's peak RSS (with its file-backed and anonymous parts) while running."""

    def __init__(self, process: psutil.Process):
        self.process = process
        self.peak = {"rss": 0, "file": 0, "anon": 0}
        self.samples = 0
        self._stop = threading.Event()
        self.exact = _reset_hwm(process.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            now = rss(self.process)
            self.samples += 1
            if now["rss"] > self.peak["rss"]:
                self.peak = now
            if self._stop.wait(SAMPLE_S):
                return

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        hwm = _read_hwm(self.process.pid) if self.exact else None
        return {**self.peak, "hwm": hwm, "samples": self.samples}


def rss(process: psutil.Process) -> dict:
    """Resident bytes now: all, file-backed (the mapped model file, libraries) and the rest."""
    info = process.memory_info()
    return {"rss": info.rss, "file": info.shared, "anon": info.rss - info.shared}


def _reset_hwm(pid: int) -> bool:
    """Reset the kernel's peak RSS (VmHWM) of pid to its current RSS; False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return _read_hwm(pid) is not None
    except OSError:
        return False


def _read_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            found = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def wait_healthy(server: servers.Server, timeout: float = servers.START_TIMEOUT_S) -> None:
    url = server.url.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


def long_prompt(count: Callable[[str], int], tokens: int, seed: int) -> str:
    """Filler of about `tokens` tokens (never above), from a fixed seed."""
    rng = random.Random(f"{workload.SEED}-memory-{seed}")
    sentences, total = [], 0
    while True:
        sentence = workload.sentence(rng)
        cost = count(" " + sentence)
        if total + cost > tokens:
            return " ".join(sentences)
        sentences.append(sentence)
        total += cost


def slots_used(log_path: Path) -> int | None:
    """The slots the engine took, from its "loaded X (n_ctx N, K slots, ...)" line."""
    found = re.findall(r"loaded \S+ \(n_ctx \d+, (\d+) slots?",
                       log_path.read_text(errors="replace"))
    return int(found[-1]) if found else None


def measure(name: str, model: Path, n_ctx: int, kv_type: str, *, slots: int, kv_ram_mb: int,
            folder: Path, count: Callable[[str], int], mmap: str = "auto") -> dict:
    info = read_gguf_info(model)
    prompt = long_prompt(count, n_ctx // 2 - 32, n_ctx)  # the template's tokens fill the rest
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    log.info("%s, n_ctx %d, %s: starting the server", name, n_ctx, kv_type)
    with servers.start(servers.REAME_SLOTS, folder, model, n_ctx=n_ctx, slots=slots, threads=1,
                       max_tokens=MAX_TOKENS, kv_type=kv_type, kv_ram_mb=kv_ram_mb,
                       mmap=mmap) as server:
        process = psutil.Process(server.pid)
        wait_healthy(server)
        time.sleep(SETTLE_S)
        idle = rss(process)
        sampler = Sampler(process)
        answer = users.ask(server, messages, MAX_TOKENS, time.perf_counter())
        time.sleep(TAIL_S)
        peak = sampler.stop()
        after = rss(process)
        used = slots_used(server.log_path)
    if "error" in answer:
        raise RuntimeError(f"{name}: the request failed: {answer['error']}")
    if used is None:  # the log line changed: reckon them as the engine does
        used = slots_that_fit(slots, n_ctx, info.kv_bytes_per_slot(n_ctx, kv_type),
                              kv_ram_mb * MB)
        log.warning("%s: no \"loaded\" line in %s; %d slots reckoned", name, server.log_path,
                    used)
    row = {"model": name, "label": LABELS.get(name, name), "file": model.name,
           "header": header_facts(info), "n_ctx": n_ctx, "kv_type": kv_type, "mmap": mmap,
           "slots_wanted": slots, "kv_ram_mb": kv_ram_mb, "slots": used,
           "prompt_tokens": answer["prompt_tokens"], "completion_tokens": answer["tokens"],
           "answer_s": answer["end_s"] - answer["sent_s"],
           "idle": idle, "peak": peak, "after": after,
           "peak_rss": max(peak["rss"], peak["hwm"] or 0)}
    needed = estimate(row, cpu_features())
    log.info("%s, n_ctx %d, %s: %s slots, idle %.0f MB, peak %.0f MB (%d prompt tokens); "
             "estimate %.0f MB (%+.1f%%)", name, n_ctx, kv_type, used, idle["rss"] / MB,
             row["peak_rss"] / MB, row["prompt_tokens"], needed / MB,
             100 * (needed - row["peak_rss"]) / row["peak_rss"])
    return row


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    except (OSError, AttributeError):
        pass
    import llama_cpp

    return {"cpu": cpu, "cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "llama_cpp_python": llama_cpp.__version__,
            "platform": platform.platform(), "repack": cpu_repacks(),
            "cpu_features": cpu_features()}


LOAD = """
import json, sys, time
from reame.inference.engine import Engine
started = time.perf_counter()
engine = Engine(sys.argv[1], n_ctx=int(sys.argv[2]), slots=int(sys.argv[3]), mmap=sys.argv[4],
                n_threads=1)
print(json.dumps({"load_s": time.perf_counter() - started, "mapped": engine.weights.mapped}))
"""


def load_time(model: Path, n_ctx: int, slots: int, mmap: str) -> float:
    """The median time an Engine takes to load model, each load in a fresh process."""
    times = []
    for _ in range(LOAD_RUNS):
        done = subprocess.run([sys.executable, "-c", LOAD, str(model), str(n_ctx), str(slots),
                               mmap], cwd=ROOT, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        times.append(json.loads(done.stdout.strip().splitlines()[-1])["load_s"])
    return statistics.median(times)


def measure_load_mode(name: str, model: Path, mmap: str, *, n_ctx: int, slots: int,
                      kv_ram_mb: int, folder: Path) -> dict:
    """A server's idle RSS with [model] mmap, and the engine's load time that way."""
    info = read_gguf_info(model)
    with servers.start(servers.REAME_SLOTS, folder, model, n_ctx=n_ctx, slots=slots, threads=1,
                       kv_type="f16", kv_ram_mb=kv_ram_mb, mmap=mmap) as server:
        wait_healthy(server)
        time.sleep(SETTLE_S)
        idle = rss(psutil.Process(server.pid))
        said = re.findall(r"(mapped|read into memory) \S+: (.*)",
                          server.log_path.read_text(errors="replace"))
    row = {"model": name, "label": LABELS.get(name, name), "file": model.name,
           "header": header_facts(info), "n_ctx": n_ctx, "kv_type": "f16", "mmap": mmap,
           "said": ": ".join(said[-1]) if said else None, "idle": idle,
           "load_s": load_time(model, n_ctx, slots, mmap)}
    log.info("%s, mmap = %s: idle %.0f MB (%.0f MB file-backed), load %.2f s", name, mmap,
             idle["rss"] / MB, idle["file"] / MB, row["load_s"])
    return row


def load_modes_section(data: dict) -> str:
    """results.md's table of idle servers with the model file mapped and read (--load-modes)."""
    rows = data.get("load_modes")
    if not rows:
        return ""
    features = data["machine"]["cpu_features"]
    lines = ["| model | [model] mmap | weights held | repacked | idle RSS | of which "
             "file-backed | engine load |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        info, held = info_from(r), weights_of(r, features)
        lines.append("| " + " | ".join([
            r["label"], f"`{r['mmap']}` ({'mapped' if held.mapped else 'read'})",
            f"{held.resident(info.size) / MB:,.0f} MB", f"{held.repacked / MB:,.0f} MB",
            f"{r['idle']['rss'] / MB:,.0f} MB", f"{r['idle']['file'] / MB:,.0f} MB",
            f"{r['load_s']:.2f} s"]) + " |")
    return ("\n## The model file mapped or read into memory\n\n"
            f"`{data.get('load_modes_command', '')}` on {data.get('load_modes_date', '')}. One "
            f"idle server (n_ctx {rows[0]['n_ctx']:,}, f16 KV, reame.conf's default slots) per "
            "model and `[model] mmap`: `true` maps the file (llama.cpp's default), `false` "
            "reads it into memory; `auto`, the default, reads it where llama.cpp repacks some "
            "of its matrices on this CPU. **weights held**: the estimate's weights (the file, "
            "plus the repacked matrices again where it is mapped). **engine load**: the median "
            f"of {LOAD_RUNS} `Engine(...)` loads, each in a fresh process, with the file in the "
            "page cache (a cold start reads it from disk either way).\n\n"
            + "\n".join(lines) + "\n")


# reporting


def with_estimates(rows: list[dict], features: dict) -> list[dict]:
    """Each row with the estimate of the current arithmetic and its error against the peak."""
    out = []
    for row in rows:
        needed = estimate(row, features)
        out.append({**row, "estimate": needed,
                    "error": (needed - row["peak_rss"]) / row["peak_rss"]})
    return out


def server_part(row: dict, features: dict) -> int:
    """Idle RSS less the weights as held (the file, its matrices repacked) and the slots' KV."""
    info = info_from(row)
    kv = (info.kv_bytes_per_slot(row["n_ctx"], row["kv_type"]) or 0) * row["slots"]
    return row["idle"]["rss"] - weights_of(row, features).resident(info.size) - kv


def table(rows: list[dict], features: dict) -> str:
    head = ["model", "n_ctx", "KV", "slots", "weights (file + repacked)", "KV of the slots",
            "idle RSS", "peak RSS answering", "estimate", "error"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        info, held = info_from(r), weights_of(r, features)
        repacked = held.resident(info.size) - info.size
        weights = f"{info.size / MB:,.0f}" + (f" + {repacked / MB:,.0f}" if repacked else "")
        kv = (info.kv_bytes_per_slot(r["n_ctx"], r["kv_type"]) or 0) * r["slots"]
        lines.append("| " + " | ".join([
            r["label"], f"{r['n_ctx']:,}", r["kv_type"], f"{r['slots']} of {r['slots_wanted']}",
            f"{weights} MB", f"{kv / MB:,.0f} MB", f"{r['idle']['rss'] / MB:,.0f} MB",
            f"{r['peak_rss'] / MB:,.0f} MB", f"{r['estimate'] / MB:,.0f} MB",
            f"{r['error']:+.1%}"]) + " |")
    return "\n".join(lines)


def report(data: dict, out: Path) -> str:
    repack, features = data["machine"]["repack"], data["machine"]["cpu_features"]
    rows = with_estimates(data["rows"], features)
    text = table(rows, features)
    worst = max(abs(r["error"]) for r in rows)
    prompts = sorted({f"{r['prompt_tokens']:,}" for r in rows})
    parts = [server_part(r, features) for r in rows]
    most_repacked = max(weights_of(r, features).repacked for r in rows)
    ways = sorted({r.get("mmap", "auto") for r in rows})
    out.mkdir(parents=True, exist_ok=True)
    _plot(rows, out / "memory.png")
    m = data["machine"]
    (out / "results.md").write_text(
        "# Memory of a server, measured against the Settings tab's estimate\n\n"
        f"`{data['command']}` on {data['date']}: {m['cpu']}, {m['cores']} cores, "
        f"{m['ram_gb']} GB RAM; llama-cpp-python {m['llama_cpp_python']}, Python {m['python']}"
        f"; llama.cpp {'repacks' if repack else 'does not repack'} some quantized "
        "weights on this CPU (reame/models/repack.py). MB = 2^20 bytes.\n\n"
        "Each configuration is one `python app.py` process with reame.conf's default `slots` "
        f"({data['slots']}) and `kv_ram_mb` ({data['kv_ram_mb']}), `n_threads = 1`, "
        f"`[model] mmap = {' / '.join(ways)}` (true: the model file mapped, as every server "
        "was before `auto`); `slots` "
        "is what the server log says it took. **idle RSS**: the process's resident memory after "
        f"GET /health answers 200 and {SETTLE_S:.0f} s more. **peak RSS answering**: the most "
        "of psutil's RSS sampled every 50 ms and the kernel's peak (VmHWM, reset before the "
        "request), from a streamed stateless /v1/chat/completions whose prompt fills half of "
        f"n_ctx with filler ({' / '.join(prompts)} prompt tokens) and max_tokens {MAX_TOKENS}, "
        f"until {TAIL_S:.0f} s after the reply. One run per configuration: memory does not "
        "vary with the machine's load as timings do.\n\n"
        "What the figures are made of: idle RSS = the model file (all of it read in at load) "
        "+ where the file is mapped, the copy llama.cpp's CPU backend makes of the matrices it "
        "repacks into its interleaved layout (those weights count twice; up to "
        f"{most_repacked / MB:,.0f} MB here) + the slots' KV (allocated and "
        "cleared at load) + the server itself (Python, Gradio, llama.cpp's library and "
        f"vocabulary: idle RSS less the rest, {min(parts) / MB:,.0f} to {max(parts) / MB:,.0f} "
        "MB here). "
        "Answering adds the KV of the conversation copied out of llama.cpp to be written to "
        "its file after the reply (prompt tokens x KV bytes per token), and a few MB of "
        "compute buffers (decodes of 16 tokens).\n\n"
        "**estimate**: `reame.models.catalog.memory_needed` from the file's header facts (recorded "
        "in results.json), as the Settings tab checks a model before loading it: the file + "
        "the repacked matrices where it is mapped + the slots' KV + one full window's KV "
        "copied out + 200 MB for the server. It is for a full window, so it sits a little "
        "above these half-window peaks. **error**: (estimate - peak) / peak; the target is within "
        f"±{TOLERANCE:.0%} for every row (tests/inference/test_memory_estimate.py). "
        f"Worst here: {worst:.1%}.\n\n"
        + text + "\n\n![memory](memory.png)\n" + load_modes_section(data), encoding="utf-8")
    (out / "results.json").write_text(json.dumps({**data, "rows": rows}, indent=1) + "\n",
                                      encoding="utf-8")
    return text


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["idle"]["rss"] / MB for r in rows], width=0.4,
           label="idle RSS", color="#9ecae1")
    ax.bar([i + 0.2 for i in x], [r["peak_rss"] / MB for r in rows], width=0.4,
           label="peak RSS answering", color="#3182bd")
    ax.scatter(list(x), [r["estimate"] / MB for r in rows], marker="_", s=600, color="#d62728",
               zorder=3, label="estimate (Settings tab)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['label'].split(' ')[0].split('-')[-1]}\n{r['n_ctx'] // 1024}k "
                        f"{r['kv_type']}" for r in rows], fontsize=8)
    ax.set_ylabel("MB")
    ax.set_title(f"Server memory, {rows[0]['slots_wanted']} slots: measured and estimated")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--n-ctx", default="4096,8192")
    parser.add_argument("--kv-types", default="f16,q8_0")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                        help="only recompute the estimates and rewrite results.md, "
                             "results.json and the plot from a results.json")
    parser.add_argument("--load-modes", action="store_true",
                        help="only measure idle servers with the model file mapped and read "
                             "(at the first --n-ctx), into the results.json in --out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.report_only:
        data = json.loads(args.report_only.read_text(encoding="utf-8"))
        print(report(data, args.report_only.parent))
        return 0
    names = args.models.split(",")
    unknown = set(names) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}: "
                     f"pick from {', '.join(MODELS)}")
    if not DEFAULT_MODEL.exists():
        log.error("the default model is missing at %s: run `make model`", DEFAULT_MODEL)
        return 2
    for name in names:
        if name in make_models.SHAPES:
            make_models.make(make_models.SHAPES[name])  # skipped when already there
    from llama_cpp import Llama

    vocab = Llama(model_path=str(DEFAULT_MODEL), vocab_only=True, verbose=False)  # the shapes' too
    count = lambda t: len(vocab.tokenize(t.encode(), add_bos=False, special=False))  # noqa: E731
    slots, kv_ram_mb = default("model", "slots"), default("model", "kv_ram_mb")
    command = "python -m bench.memory" + "".join(f" {shlex.quote(a)}"
                                                 for a in (argv or sys.argv[1:]))
    before = args.out / "results.json"
    kept = json.loads(before.read_text(encoding="utf-8")) if before.exists() else {}
    if args.load_modes:
        return measure_load_modes(names, kept, command, int(args.n_ctx.split(",")[0]), args.out)
    data = {"command": command, "date": dt.date.today().isoformat(), "machine": machine(),
            "slots": slots, "kv_ram_mb": kv_ram_mb, "max_tokens": MAX_TOKENS, "rows": [],
            **{k: v for k, v in kept.items() if k.startswith("load_modes")}}
    with tempfile.TemporaryDirectory(prefix="reame-memory-") as work:
        for name in names:
            for n_ctx in (int(n) for n in args.n_ctx.split(",")):
                for kv_type in args.kv_types.split(","):
                    folder = Path(work) / f"{name}-{n_ctx}-{kv_type}"
                    data["rows"].append(measure(name, MODELS[name], n_ctx, kv_type, slots=slots,
                                                kv_ram_mb=kv_ram_mb, folder=folder, count=count))
    print(report(data, args.out))
    return 0


def measure_load_modes(names: list[str], data: dict, command: str, n_ctx: int,
                       out: Path) -> int:
    """--load-modes: each model's idle server mapped and read, into data (results.json)."""
    if not data.get("rows"):
        log.error("no results.json with the servers' rows in %s: run the full bench first", out)
        return 2
    if data["machine"].get("cpu_features") != cpu_features():
        log.error("%s was measured with other CPU features than here", out / "results.json")
        return 2
    slots, kv_ram_mb = default("model", "slots"), default("model", "kv_ram_mb")
    rows = []
    with tempfile.TemporaryDirectory(prefix="reame-memory-") as work:
        for name in names:
            for mmap in LOAD_MODES:
                rows.append(measure_load_mode(name, MODELS[name], mmap, n_ctx=n_ctx, slots=slots,
                                              kv_ram_mb=kv_ram_mb,
                                              folder=Path(work) / f"{name}-{mmap}"))
    data.update(load_modes=rows, load_modes_command=command,
                load_modes_date=dt.date.today().isoformat())
    report(data, out)
    print(load_modes_section(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
