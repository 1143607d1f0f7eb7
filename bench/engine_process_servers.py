"""The engine in a process of its own ([model] engine_process) against the engine in the
server's process, as a user meets them: two real servers of this checkout, side by side.

    python -m bench.engine_process_servers [--model PATH] [--runs 5] [--threads 1]
                                           [--out bench/results/engine_process_servers]

Both servers run the same reame.conf but for engine_process (bench/servers.py writes it: 4
slots, n_ctx 4,096, the KV cache on disk), each request sent to one and then the other, the
order alternating run by run; medians of --runs:

- start to ready: the process's start to the first GET /health 200;
- first contact: the first token of a new prompt of about 800 tokens (stateless /v1, streamed,
  a prompt no cache holds);
- a reply's speed: milliseconds per token of a 128-token reply (the end tokens banned), from
  its first token to its last, as the client receives them;
- the crash (engine process only): the engine's process killed with SIGKILL, until /health
  answers 200 again and until the next request is answered.

Prints the table; writes engine_process_servers.md, .json and .png into --out/DATE-COMMIT.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from bench import report_format, servers

log = logging.getLogger("bench.engine_process_servers")
OUT = servers.ROOT / "bench" / "results" / "engine_process_servers"
MODEL = servers.ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
STORY = "The old lighthouse keeper wrote in his log every night about the ships he saw. "
MODES = ("in the server's process", "in a process of its own")
MODEL_ID = [""]  # the model's id on the servers (its file's name)


class Reame:
    def __init__(self, folder: Path, model: Path, threads: int, engine_process: bool):
        self.folder, self.engine_process = folder, engine_process
        folder.mkdir(parents=True)
        self.config = servers._reame_config(folder, model, n_ctx=4096, threads=threads,
                                            max_tokens=512, slots=4)
        text = self.config.read_text()
        self.config.write_text(text.replace(
            "[model]\n", f"[model]\nengine_process = {str(engine_process).lower()}\n", 1))
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> float:
        port = servers.free_port()
        self.url = f"http://127.0.0.1:{port}"
        with (self.folder / "server.log").open("ab") as out:
            started = time.perf_counter()
            self.process = subprocess.Popen(
                [sys.executable, str(servers.ROOT / "app.py"), "--config", str(self.config),
                 "--port", str(port)], cwd=servers.ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
        return self.healthy(started)

    def healthy(self, started: float, timeout: float = 120) -> float:
        while time.perf_counter() - started < timeout:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return time.perf_counter() - started
            except (urllib.error.URLError, OSError):
                time.sleep(0.02)
        raise RuntimeError(f"{self.folder}: not healthy within {timeout} s")

    def stop(self) -> None:
        if self.process is not None:
            servers.stop(self.process)
            self.process = None

    def engine(self) -> psutil.Process:
        for child in psutil.Process(self.process.pid).children(recursive=True):
            if "reame.inference.remote.child" in " ".join(child.cmdline()):
                return child
        raise RuntimeError("no engine process")


def stream(url: str, text: str, max_tokens: int, logit_bias: dict | None = None) -> dict:
    """A streamed stateless /v1 request: the first token's time and each token's arrival."""
    body = {"model": MODEL_ID[0], "messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, **({"logit_bias": logit_bias}
                                                           if logit_bias else {})}
    request = urllib.request.Request(url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    sent = time.perf_counter()
    times = []
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            if line.startswith(b"data: {") and b'"content"' in line:
                times.append(time.perf_counter())
    return {"first_s": times[0] - sent, "ms_per_token": 1000 * (times[-1] - times[0])
            / max(1, len(times) - 1), "tokens": len(times)}


def end_tokens(model: Path) -> dict[str, float]:
    from reame.inference.engine import Engine

    engine = Engine(model, n_ctx=256, n_threads=1)
    try:
        return {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}
    finally:
        engine.close()


def run(model: Path, runs: int, threads: int, work: Path) -> dict:
    MODEL_ID[0] = model.name
    banned = end_tokens(model)
    both = [Reame(work / f"mode{n}", model, threads, n == 1) for n in range(2)]
    results = {mode: {"ready_s": [], "first_s": [], "ms_per_token": []} for mode in MODES}
    for n in range(2):  # two starts each, alternated
        for server in (both if n % 2 == 0 else both[::-1]):
            results[MODES[server.engine_process]]["ready_s"].append(server.start())
            if n == 0:
                server.stop()
    try:
        for run_no in range(runs):
            order = both if run_no % 2 == 0 else both[::-1]
            for server in order:  # a prompt no cache holds: its own words each run
                prompt = f"Run {run_no} of {server.engine_process}. " + STORY * 50 + "Go on."
                first = stream(server.url, prompt, 8)
                results[MODES[server.engine_process]]["first_s"].append(first["first_s"])
            for server in order:
                reply = stream(server.url, f"Tell a long story, take {run_no}.", 128, banned)
                results[MODES[server.engine_process]]["ms_per_token"].append(
                    reply["ms_per_token"])
        remote = both[1]
        killed = time.perf_counter()
        remote.engine().send_signal(signal.SIGKILL)
        time.sleep(0.05)
        crash = {"health_s": remote.healthy(killed)}
        stream(remote.url, "Say hello.", 8)
        crash["answered_s"] = time.perf_counter() - killed
    finally:
        for server in both:
            server.stop()
    return {"modes": results, "crash": crash}


def table(data: dict) -> str:
    a, b = (data["modes"][mode] for mode in MODES)
    med = statistics.median
    rows = [("start to ready, s", med(a["ready_s"]), med(b["ready_s"])),
            ("first contact (~800 tokens), first token, s", med(a["first_s"]),
             med(b["first_s"])),
            ("a reply, ms a token", med(a["ms_per_token"]), med(b["ms_per_token"]))]
    lines = [f"| measure | {MODES[0]} | {MODES[1]} | cost |", "|---|---:|---:|---:|"]
    for name, x, y in rows:
        lines.append(f"| {name} | {x:.3f} | {y:.3f} | {100 * (y - x) / x:+.1f} % |")
    crash = data["crash"]
    lines.append(f"| after a SIGKILL of the engine: /health 200 again, s | | "
                 f"{crash['health_s']:.2f} | |")
    lines.append(f"| after a SIGKILL of the engine: the next request answered, s | | "
                 f"{crash['answered_s']:.2f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_process_servers",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    with tempfile.TemporaryDirectory(prefix="reame-engine-process-") as work:
        data = run(args.model, args.runs, args.threads, Path(work))
    data.update(command="python -m bench.engine_process_servers " + " ".join(
        sys.argv[1:] if argv is None else argv), machine=report_format.machine_info(),
        model=args.model.name, runs=args.runs, threads=args.threads)
    out = args.out or report_format.run_folder(OUT, "")
    out.mkdir(parents=True, exist_ok=True)
    text = table(data)
    (out / "engine_process_servers.json").write_text(json.dumps(data, indent=1))
    (out / "engine_process_servers.md").write_text(
        f"# The engine in a process of its own ({out.name})\n\n`{data['command']}`, "
        f"{args.model.name}, {args.threads} thread(s), medians of {args.runs} runs.\n\n"
        + text + "\n\n![cost](engine_process_servers.png)\n")
    plot(data, out / "engine_process_servers.png")
    print(text)
    return 0


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = (data["modes"][mode] for mode in MODES)
    names = ["start to ready", "first token (~800)", "ms a token"]
    keys = ["ready_s", "first_s", "ms_per_token"]
    ratios = [statistics.median(b[k]) / statistics.median(a[k]) for k in keys]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, ratios, color="#4a7")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.05, color="red", linewidth=0.8, linestyle="--")
    ax.set_xlabel("engine in its own process / in the server's (1 = the same; red: +5 %)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
