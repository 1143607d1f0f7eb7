"""A big import against everyone else: how long it takes, and how long another user's "New chat"
waits meanwhile.

    python -m bench.import_load [--chats 43] [--messages 10000] [--also OTHER_CHECKOUT ...]

Writes one Reame export of --chats chats of --messages messages each (430,000 messages, about
16 MB, by default), then, in a process of each checkout (this one, and --also others, e.g. a
worktree of an older commit: side by side in one run), imports it as bob into a new SQLite
database while alice makes a chat every 50 ms. Prints the table; writes import_load.md,
import_load.json and import_load.png to --out. No model is loaded: an import does not use it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in the checkout measured (its own reame package): prints one JSON line.
MEASURE = r"""
import json, sys, threading, time
from pathlib import Path
from reame.chats.service import ChatService
from reame.config.chat_settings import ChatSettings
from reame.chats.store import Store

data, folder = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2])
service = ChatService(Store(folder / "reame.db"), None, ChatSettings(), max_chats=100_000)
waits, errors, done = [], [], threading.Event()

def alice():
    while not done.is_set():
        start = time.perf_counter()
        try:
            service.new_chat(user="alice")
        except Exception as exc:  # e.g. "database is locked"
            errors.append(repr(exc)[:200])
        waits.append(time.perf_counter() - start)
        time.sleep(0.05)

thread = threading.Thread(target=alice)
start = time.perf_counter()
thread.start()
made = service.import_chats(data, "bob")
took = time.perf_counter() - start
done.set()
thread.join()
print(json.dumps({"import_s": took, "chats": len(made), "waits": waits, "errors": errors}))
"""


def export(chats: int, messages: int) -> dict:
    def chat(n: int) -> dict:
        listed = [{"id": i + 1, "parent": i or None, "role": "user" if i % 2 == 0 else "assistant",
                   "content": f"Message {i} of chat {n}: the weather, the town, what to wear."}
                  for i in range(messages)]
        return {"format": "reame-chat", "version": 1, "title": f"chat {n}",
                "current": messages, "messages": listed}
    return {"format": "reame-chats", "version": 1, "chats": [chat(n) for n in range(chats)]}


def measure(checkout: Path, data: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-c", MEASURE, str(data), folder], cwd=checkout,
                              capture_output=True, text=True, check=True,
                              env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=43)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--also", type=Path, nargs="*", default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "import_load")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        text = json.dumps(export(args.chats, args.messages)).encode()
        file.write(text)
        file.flush()
        results = {}
        for checkout in [ROOT, *args.also]:
            name = "this checkout" if checkout == ROOT else str(checkout)
            results[name] = measure(checkout.resolve(), Path(file.name))
    size = len(text) / 2**20
    rows = ["| checkout | import | another user's New chat: median | 95th pct | max | failed |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        waits = sorted(r["waits"]) or [0.0]
        rows.append(f"| {name} | {r['import_s']:.1f} s | {statistics.median(waits) * 1000:.0f} ms "
                    f"| {waits[int(len(waits) * 0.95) - 1 if len(waits) > 1 else 0] * 1000:.0f} ms "
                    f"| {waits[-1] * 1000:.0f} ms | {len(r['errors'])} of {len(r['waits'])} |")
    table = (f"Import of {args.chats} chats x {args.messages:,} messages "
             f"({args.chats * args.messages:,} messages, {size:.1f} MB) while another user makes "
             f"a chat every 50 ms:\n\n" + "\n".join(rows) + "\n")
    print(table)
    (args.out / "import_load.md").write_text(table)
    (args.out / "import_load.json").write_text(json.dumps(results, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for name, r in results.items():
        axis.plot([w * 1000 for w in r["waits"]], label=name)
    axis.set_xlabel("another user's New chat, in order")
    axis.set_ylabel("wait (ms)")
    axis.set_yscale("log")
    axis.set_title("New chat during a big import")
    axis.legend()
    figure.tight_layout()
    figure.savefig(args.out / "import_load.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
