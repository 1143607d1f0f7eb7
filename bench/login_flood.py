"""Logins against the event loop: how long a quick request waits while clients log in.

    python -m bench.login_flood [--clients 4] [--seconds 15] [--also OTHER_CHECKOUT ...]

Starts `python app.py` with accounts (a temp folder, the default model) and measures GET
/v1/models (one client, one request after another): first alone, then while --clients threads
post logins back to back. The logins use the right password, so that every one costs a
password check (failed logins are cut short by the rate limit after 10). --also runs the same
against other checkouts of Reame (e.g. a worktree of an older commit), one after the other in
the same run, for a side-by-side table. Prints the table; writes login_flood.md and
login_flood.png to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from bench.checkouts import commit, serve

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PASSWORD = "flood-password-1"


def write_config(checkout: Path, folder: Path) -> tuple[Path, str]:
    """A config with one user "flood" (added by that checkout); its path and the user's API key."""
    config = folder / "reame.conf"
    config.write_text(f"[model]\nmodel_path = {MODEL}\nn_ctx = 1024\n\n[server]\nusers_file =\n\n"
                      f"[storage]\nsessions_dir = {folder / 'sessions'}\n")
    made = subprocess.run([sys.executable, str(checkout / "app.py"), "adduser", "flood", "--key",
                           "--config", str(config), "--password-stdin"], input=PASSWORD + "\n",
                          capture_output=True, text=True, cwd=checkout, check=True)
    return config, made.stdout.split("API key (shown once): ")[1].split()[0]


def latencies(url: str, key: str, seconds: float) -> list[float]:
    request = urllib.request.Request(url + "v1/models", headers={"Authorization": f"Bearer {key}"})
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
        out.append(time.perf_counter() - started)
    return out


def flood(url: str, stop: threading.Event, counted: list[int]) -> None:
    body = urllib.parse.urlencode({"username": "flood", "password": PASSWORD}).encode()
    while not stop.is_set():
        request = urllib.request.Request(url + "login", data=body, method="POST", headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
            counted.append(1)
        except (urllib.error.URLError, OSError):
            counted.append(0)


def measure(checkout: Path, clients: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="reame-flood-") as tmp:
        config, key = write_config(checkout, Path(tmp))
        with serve(checkout, config) as url:
            latencies(url, key, 2)  # warm up
            alone = latencies(url, key, seconds)
            stop, counted = threading.Event(), []
            threads = [threading.Thread(target=flood, args=(url, stop, counted), daemon=True)
                       for _ in range(clients)]
            for thread in threads:
                thread.start()
            time.sleep(1)  # the logins under way
            during = latencies(url, key, seconds)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
    return {"checkout": str(checkout), "commit": commit(checkout), "alone": alone, "during": during,
            "logins_per_s": sum(counted) / (seconds + 1)}


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"{statistics.median(ms):.1f} / {p95:.1f} / {ms[-1]:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.login_flood", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--also", type=Path, nargs="*", default=[],
                        help="other checkouts to measure the same way")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    runs = [measure(checkout, args.clients, args.seconds) for checkout in [ROOT, *args.also]]
    lines = [f"GET /v1/models latency in ms (median / p95 / max), alone and while {args.clients} "
             f"clients log in back to back; {args.seconds:g} s each, load average "
             f"{os.getloadavg()[0]:.2f}.", "",
             "| commit | alone | during logins | logins/s |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['commit']} | {summary(r['alone'])} | {summary(r['during'])} | "
              f"{r['logins_per_s']:.1f} |" for r in runs]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "login_flood.md").write_text(
        f"# Logins against the event loop\n\n`python -m bench.login_flood "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{table}\n")
    (args.out / "login_flood.json").write_text(json.dumps(runs))
    plot(runs, args.out / "login_flood.png")


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    data, labels = [], []
    for run in runs:
        for when in ("alone", "during"):
            data.append([v * 1000 for v in run[when]])
            labels.append(f"{run['commit']}\n{'alone' if when == 'alone' else 'logins'}")
    axis.boxplot(data, showfliers=True)
    axis.set_xticks(range(1, len(labels) + 1), labels)
    axis.set_yscale("log")
    axis.set_ylabel("GET /v1/models latency (ms, log)")
    axis.set_title("A quick request while clients log in")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
