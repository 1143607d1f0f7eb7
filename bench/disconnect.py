"""Clients that go away: how long the next request waits on a 1-slot server.

    python -m bench.disconnect [--runs 3] [--also OTHER_CHECKOUT ...]

For each way a client can go away, starts `python app.py` with one slot (a temp folder, the
default model, replies of up to 400 tokens), does it, and times a short /v1 request ("Say hi.",
8 tokens) from the moment the client went away until its whole answer: the time the abandoned
turn still held the only slot, plus the short request itself. The short request gives up after
60 s ("> 60": the slot was still held). The first row is that short request on a free slot.
Ways: a /v1 stream closed before its first event, after 1 and after 20 events, 0.5 s and 1.5 s
after it was sent; a client that hangs up 1 s into a 1,500-token prompt, streamed and not; a
gradio_client job cancelled 1.5 s into that prompt. The long replies ban the end tokens
(logit_bias), so each abandoned turn would run its full 400 tokens. --also runs the same against
other checkouts (e.g. a worktree of an older commit) in the same run, for a side-by-side table
(an older server ignores logit_bias and refuses nothing). Prints the table; writes
disconnect.md, disconnect.json and disconnect.png to --out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.checkouts import commit, serve

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WAIT_S = 60  # the next request gives up then (the client's usual timeout)
LONG = "Write a very long story about a dragon who learns to sing, with many chapters."
LONG_PROMPT = ("Here is a list of facts. " + " ".join(
    f"Fact {i}: the river number {i} flows into lake number {i + 7}." for i in range(95))
    + " Summarize the facts.")
WAYS = ["free slot", "stream closed before its first event", "stream closed after 1 event",
        "stream closed after 20 events", "stream closed after 0.5 s", "stream closed after 1.5 s",
        "hung up mid-prompt (stream)",
        "hung up mid-prompt (no stream)", "gradio_client job cancelled mid-prompt"]


def write_config(folder: Path) -> Path:
    config = folder / "reame.conf"
    config.write_text(f"[model]\nmodel_path = {MODEL}\nn_ctx = 2048\nslots = 1\n\n"
                      "[generation]\ntemperature = 0\nmax_tokens = 400\n\n"
                      f"[server]\nusers_file =\n\n[storage]\nsessions_dir = "
                      f"{folder / 'sessions'}\n")
    return config


def model_id(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def end_tokens() -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from reame.inference.engine import Engine

    engine = Engine(MODEL, n_ctx=256)
    try:
        return {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}
    finally:
        engine.close()


def body(model: str, text: str, *, stream: bool, max_tokens: int, bias: dict) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}],
                       "stream": stream, "max_tokens": max_tokens, "temperature": 0,
                       **({"logit_bias": bias} if bias else {})}).encode()


def open_v1(port: int, payload: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def read_events(sock: socket.socket, n: int) -> None:
    sock.settimeout(120)
    seen = b""
    while seen.count(b"\n\n") < n + 1:  # the headers end with a blank line too
        chunk = sock.recv(4096)
        if not chunk:
            return
        seen += chunk


def next_answer(port: int, model: str) -> float:
    """Seconds until the short request's whole answer; inf if none came within WAIT_S."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v1/chat/completions",
                     body(model, "Say hi.", stream=False, max_tokens=8, bias={}),
                     {"Content-Type": "application/json"})
        conn.getresponse().read()
    except TimeoutError:
        return math.inf
    finally:
        conn.close()
    return time.perf_counter() - started


def go_away(way: str, port: int, model: str, bias: dict) -> float:
    """Make a client go away in that way; the seconds from then to the next answer."""
    if way == "free slot":
        return next_answer(port, model)
    if way == "gradio_client job cancelled mid-prompt":
        from gradio_client import Client

        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        chat = client.predict(api_name="/new_chat")
        job = client.submit(chat, LONG_PROMPT, api_name="/send")
        time.sleep(1.5)
        job.cancel()
        return next_answer(port, model)
    mid_prompt = way.startswith("hung up")
    payload = body(model, LONG_PROMPT if mid_prompt else LONG,
                   stream="no stream" not in way, max_tokens=400, bias=bias)
    sock = open_v1(port, payload)
    if mid_prompt:
        time.sleep(1.0)
    elif way.endswith(" s"):
        time.sleep(float(way.split("after ")[1].split()[0]))
    elif "after" in way:
        read_events(sock, int(way.split("after ")[1].split()[0]))
    sock.close()
    return next_answer(port, model)


def measure(checkout: Path, runs: int, bias: dict) -> dict:
    """Each way on a server of its own, so that a slot an old server never frees does not
    spoil the next way."""
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(runs):
        for way in WAYS:
            with tempfile.TemporaryDirectory(prefix="reame-disconnect-") as tmp:
                with serve(checkout, write_config(Path(tmp))) as url:
                    port = urllib.parse.urlsplit(url).port
                    model = model_id(port)
                    next_answer(port, model)  # warm
                    times[way].append(go_away(way, port, model, bias))
            print(f"{commit(checkout)} {way}: {times[way][-1]:.2f} s", flush=True)
    return {"checkout": str(checkout), "commit": commit(checkout), "times": times}


def seconds(value: float) -> str:
    return f"> {WAIT_S}" if math.isinf(value) else f"{value:.2f}"


def table(results: list[dict], runs: int) -> str:
    head = "| client | " + " | ".join(r["commit"] for r in results) + " |"
    lines = [f"Seconds from a client going away to the next short /v1 answer on a 1-slot "
             f"server (median of {runs}; max in brackets; > {WAIT_S}: no answer, the slot was "
             f"still held), {os.cpu_count()} cores.", "", head,
             "| --- |" + " --- |" * len(results)]
    for way in WAYS:
        cells = [f"{seconds(statistics.median(r['times'][way]))} "
                 f"({seconds(max(r['times'][way]))})" for r in results]
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.disconnect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--also", type=Path, nargs="*", default=[],
                        help="other checkouts to measure the same way")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "disconnect")
    parser.add_argument("--redraw", action="store_true",
                        help="no measuring: the table and plot again from --out's JSON")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.redraw:
        saved = json.loads((args.out / "disconnect.json").read_text())
        results, runs, command = saved["results"], saved["runs"], saved["command"]
    else:
        bias = end_tokens()
        results = [measure(checkout, args.runs, bias) for checkout in [ROOT, *args.also]]
        runs = args.runs
        command = " ".join(argv if argv is not None else sys.argv[1:])
        (args.out / "disconnect.json").write_text(json.dumps(
            {"command": command, "runs": runs, "results": results}))
    text = table(results, runs)
    print(text)
    (args.out / "disconnect.md").write_text(
        f"# Clients that go away\n\n`python -m bench.disconnect {command}`\n\n{text}\n")
    plot(results, args.out / "disconnect.png")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(results)
    for n, result in enumerate(results):
        medians = [min(statistics.median(result["times"][way]), WAIT_S) for way in WAYS]
        axis.barh([i + n * width for i in range(len(WAYS))], medians, height=width,
                  label=result["commit"])
    axis.set_yticks([i + width * (len(results) - 1) / 2 for i in range(len(WAYS))], WAYS)
    axis.invert_yaxis()
    axis.set_xscale("log")
    axis.set_xlabel(f"seconds until the next short answer (log; {WAIT_S}: none came)")
    axis.set_title("A 1-slot server after a client goes away")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
