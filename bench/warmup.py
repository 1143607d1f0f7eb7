"""Ready means fast: the first request after a start against the next, with and without the
warm-up, on real server processes.

    python -m bench.warmup [--runs 5] [--history 2800] [--out bench/results/warmup]

A folder holds four chats of about --history tokens each, their KV files on disk (one turn each
made them). For each run and each variant (`[server] warm_up` false, then true) the server
starts on a fresh copy of that folder; once GET /health answers 200 (as a load balancer would
wait), two chats get one message each through the named API (gradio_client, the page's way:
the client first loads the app's config, as the page does) and two through /v1 (the openai
SDK, X-Reame-Chat), in an order that alternates between runs. Measured: from the process's
start to /health 200, and the time to the first streamed token of each request, the first
request of the process against the next of the same path. Prints a table, writes results.md,
results.json and warmup.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from . import servers, workload
from .systems import SYSTEM_PROMPT

log = logging.getLogger("bench.warmup")

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "Sum up what we said in one sentence."
VARIANTS = {"no warm-up": False, "warm-up": True}
N_CTX = 4096
MAX_TOKENS = 8
READY_TIMEOUT_S = 300


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.warmup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--history", type=int, default=2800, help="tokens per chat")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "warmup")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reame-warmup-") as work:
        work = Path(work)
        base = build_base(work / "base", args.model, args.history)
        rows = []
        for run in range(args.runs):
            for variant, warm in VARIANTS.items():
                row = measure(base, work / f"run{run}-{warm}", args.model, warm=warm,
                              v1_first=run % 2 == 1)
                row.update(run=run, variant=variant)
                log.info("%s", row)
                rows.append(row)
    out = {"runs": args.runs, "history_tokens": args.history, "model": args.model.name,
           "n_ctx": N_CTX, "rows": rows, "summary": summarise(rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(out, indent=1))
    table = markdown(out)
    (args.out / "results.md").write_text(table)
    plot(out, args.out / "warmup.png")
    print(table)
    return 0


# the chats


def build_base(folder: Path, model: Path, history: int) -> Path:
    """A server folder with four chats of about history tokens, each with its KV file."""
    from llama_cpp import Llama

    vocab = Llama(str(model), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=True))

    config = config_file(folder, model, warm=False)
    from reame.chats.store import Store

    store = Store(folder / "sessions" / "reame.db")
    for i in range(4):
        chat = store.create_chat(title=f"chat {i}", system_prompt=SYSTEM_PROMPT,
                                 temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
        hist = workload.history(count, history, seed=workload.SEED + 2000 + i)
        for user, reply in hist.pairs:
            store.add_message(chat.id, "user", user)
            store.add_message(chat.id, "assistant", reply)
    store.db.dispose()
    with running(config) as (url, _):
        from gradio_client import Client

        client = Client(url, verbose=False)
        for chat_id in range(1, 5):  # one turn each: its KV file
            log.info("building chat %d's KV", chat_id)
            client.predict(chat_id, QUESTION, api_name="/send")
    return folder


def config_file(folder: Path, model: Path, *, warm: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = servers._reame_config(folder, model, n_ctx=N_CTX, threads=0,
                                   max_tokens=MAX_TOKENS, slots=4)
    text = config.read_text().replace("[server]\n", f"[server]\nwarm_up = {str(warm).lower()}\n")
    config.write_text(text)
    return config


@contextlib.contextmanager
def running(config: Path) -> Iterator[tuple[str, float]]:
    """The server on config: its URL and the seconds from its start to /health 200."""
    port = servers.free_port()
    log_path = config.parent / "server.log"
    started = time.perf_counter()
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--config", str(config), "--port", str(port)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    url = f"http://127.0.0.1:{port}/"
    try:
        ready = wait_healthy(process, url, started)
        yield url, ready
    finally:
        servers.stop(process)


def wait_healthy(process: subprocess.Popen, url: str, started: float) -> float:
    deadline = started + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server ended with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "health", timeout=2) as answer:
                if answer.status == 200:
                    return time.perf_counter() - started
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.02)
    raise RuntimeError("the server was not healthy in time")


# one measurement


def measure(base: Path, folder: Path, model: Path, *, warm: bool, v1_first: bool) -> dict:
    shutil.copytree(base, folder)
    config = config_file(folder, model, warm=warm)
    row = {}
    with running(config) as (url, ready):
        row["ready_s"] = ready
        order = [("v1", 3), ("v1", 4), ("api", 1), ("api", 2)] if v1_first else [
            ("api", 1), ("api", 2), ("v1", 3), ("v1", 4)]
        for n, (path, chat_id) in enumerate(order):
            ttft, server_ttft, source = (ask_v1(url, chat_id, model.name) if path == "v1"
                                         else ask_api(url, chat_id))
            which = "first" if n % 2 == 0 else "next"
            row[f"{path}_{which}_s"] = ttft
            row[f"{path}_{which}_server_s"] = server_ttft
            row[f"{path}_{which}_source"] = source
        row["first_path"] = order[0][0]
    shutil.rmtree(folder)
    return row


def ask_api(url: str, chat_id: int) -> tuple[float, float, str]:
    """The named API's /send, as the page sends: the time to the first streamed text."""
    from gradio_client import Client

    client = Client(url, verbose=False)  # loads the app's config, as the page does
    sent = time.perf_counter()
    job = client.submit(chat_id, QUESTION, api_name="/send")
    first = None
    while first is None and not job.done():
        if any(_has_reply(o) for o in job.outputs()):
            first = time.perf_counter()
        time.sleep(0.002)
    job.result()
    first = first or time.perf_counter()
    stats = client.predict(chat_id, api_name="/get_chat")["messages"][-1]["stats"]
    return first - sent, stats["first_token_s"], stats["source"]


def _has_reply(output) -> bool:
    """Whether a /send update (the reply so far, a string) holds any text."""
    return bool(str(output or "").strip())


def ask_v1(url: str, chat_id: int, model_id: str) -> tuple[float, float, str]:
    """A /v1 turn of a stored chat, streamed: the time to the first content chunk."""
    from openai import OpenAI

    api = OpenAI(base_url=url + "v1", api_key="bench", max_retries=0)
    sent = time.perf_counter()
    first, extra = None, {}
    for chunk in api.chat.completions.create(
            model=model_id, stream=True, temperature=0, max_tokens=MAX_TOKENS,
            extra_headers={"X-Reame-Chat": str(chat_id)},
            messages=[{"role": "user", "content": QUESTION}]):
        extra = (chunk.model_extra or {}).get("reame") or extra
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    api.close()
    return (first or time.perf_counter()) - sent, extra.get("first_token_s"), extra.get(
        "source")


# the report


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        entry = {"variant": variant, "ready_s": _median(r["ready_s"] for r in mine)}
        for path in ("api", "v1"):
            for which in ("first", "next"):
                entry[f"{path}_{which}_s"] = _median(r[f"{path}_{which}_s"] for r in mine)
                entry[f"{path}_{which}_server_s"] = _median(
                    r[f"{path}_{which}_server_s"] for r in mine)
        out.append(entry)
    return out


def _median(values) -> float:
    return statistics.median(list(values))


def markdown(out: dict) -> str:
    lines = [
        f"Model {out['model']}, n_ctx {out['n_ctx']}, chats of about {out['history_tokens']:,} "
        f"tokens restored from disk; median of {out['runs']} runs per variant. Time to the "
        f"first token as the client sees it (the server's own figure in brackets).",
        "",
        "| | start → /health 200 | named API: first request | next | /v1: first request | "
        "next |",
        "|---|---|---|---|---|---|",
    ]
    for s in out["summary"]:
        lines.append(
            f"| {s['variant']} | {s['ready_s']:.2f} s | "
            f"{s['api_first_s']:.2f} s ({s['api_first_server_s']:.2f}) | "
            f"{s['api_next_s']:.2f} s ({s['api_next_server_s']:.2f}) | "
            f"{s['v1_first_s']:.2f} s ({s['v1_first_server_s']:.2f}) | "
            f"{s['v1_next_s']:.2f} s ({s['v1_next_server_s']:.2f}) |")
    return "\n".join(lines) + "\n"


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["named API first", "named API next", "/v1 first", "/v1 next"]
    keys = ["api_first_s", "api_next_s", "v1_first_s", "v1_next_s"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.38
    for i, s in enumerate(out["summary"]):
        xs = [k + (i - 0.5) * width for k in range(len(keys))]
        ax.bar(xs, [s[k] for k in keys], width, label=s["variant"])
    ax.set_xticks(range(len(keys)), labels)
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"First request after a start vs the next ({out['history_tokens']:,}-token "
                 f"chats from disk)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
