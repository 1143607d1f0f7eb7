"""Search and the chat list on many chats: how long the page waits for them.

    python -m bench.search [--chats 1000,3000,10000] [--out bench/results/search]

Fills a real SQLite database through Reame's store (its FTS5 tables kept by the triggers) with
chats of 10 messages of 60 words each, then times, side by side on each size: the store's
search (FTS5) for a rare word, a common word and a word's start; the same searches by a plain
LIKE scan (what search would cost without the index); listing the chats; and the list's HTML.
Prints a table, writes results.md and search.png. No model is needed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from reame.chats.store import Store
from reame.web.page.chat_list import SHOWN, chat_list_html

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = 10  # per chat
WORDS = 60  # per message
QUERIES = {"rare word": "zanzibar", "common word": "river", "word start": "mount"}


def fill(store: Store, chats: int, seed: int = 1) -> None:
    """chats chats of MESSAGES messages, one in 50 mentioning the rare word."""
    rng = random.Random(seed)
    words = ("apple river mountain quantum python garden music window history ocean planet "
             "coffee train winter summer doctor language market bridge forest").split()
    vocab = [f"{w}{i}" for w in words for i in range(300)] + words
    now = time.time()
    with store.db.begin() as conn:
        raw = conn.connection.driver_connection
        raw.executemany(
            "INSERT INTO chat (id, title, system_prompt, temperature, top_p, max_tokens, "
            "window_start, owner, created_at, updated_at, pinned) "
            "VALUES (?, ?, '', 0.7, 1, 256, 0, 'u', ?, ?, 0)",
            [(i, " ".join(rng.choices(vocab, k=4)), now - i, now - i)
             for i in range(1, chats + 1)])
        rows, message_id = [], 0
        for chat_id in range(1, chats + 1):
            parent = None
            for position in range(MESSAGES):
                message_id += 1
                text = rng.choices(vocab, k=WORDS)
                if chat_id % 50 == 0 and position == 3:
                    text[7] = "Zanzibar"
                rows.append((message_id, chat_id, parent, position,
                             "user" if position % 2 == 0 else "assistant", " ".join(text), now))
                parent = message_id
            raw.execute("UPDATE chat SET leaf_id = ? WHERE id = ?", (message_id, chat_id))
        raw.executemany("INSERT INTO message (id, chat_id, parent_id, position, role, content, "
                        "created_at, stopped) VALUES (?, ?, ?, ?, ?, ?, ?, 0)", rows)


def timed(fn, runs: int) -> tuple[float, object]:
    """The median of runs calls, in ms, and the last result."""
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def like_scan(store: Store, word: str) -> int:
    """Chats whose title or messages contain word, found by scanning (no index)."""
    with store.db.connect() as conn:
        raw = conn.connection.driver_connection
        pattern = f"%{word}%"
        return len(raw.execute(
            "SELECT id FROM chat WHERE owner = 'u' AND (title LIKE ? OR id IN "
            "(SELECT chat_id FROM message WHERE content LIKE ?))", (pattern, pattern)
        ).fetchall())


def measure(chats: int, runs: int, folder: Path) -> dict:
    store = Store(folder / f"chats-{chats}.db")
    fill(store, chats)
    row = {"chats": chats}
    for name, word in QUERIES.items():
        row[f"fts {name}"], found = timed(lambda: store.search("u", word), runs)
        row[f"found {name}"] = len(found)
        row[f"like {name}"], _ = timed(lambda: like_scan(store, word), runs)
    # What the page does: the SHOWN most recent chats, and how many there are.
    row["list"], listed = timed(lambda: (store.list_chats("u", limit=SHOWN),
                                         store.count_chats("u")), runs)
    chats, total = listed
    row["html"], _ = timed(lambda: chat_list_html(chats, chats[0].id, total=total), runs)
    store.db.dispose()
    return row


def report(rows: list[dict], out: Path) -> str:
    head = ["chats"] + [f"search: {name} (FTS5 / LIKE scan)" for name in QUERIES] + [
        "list chats", "list HTML"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['chats']:,}"] + [
            f"{r[f'fts {n}']:,.1f} ms / {r[f'like {n}']:,.0f} ms "
            f"({r[f'like {n}'] / r[f'fts {n}']:,.0f}x)" for n in QUERIES] + [
            f"{r['list']:,.1f} ms", f"{r['html']:,.1f} ms"]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    _plot(rows, out / "search.png")
    (out / "results.md").write_text(
        "# Search and the chat list on many chats\n\n"
        f"`python -m bench.search` ({MESSAGES} messages of {WORDS} words per chat; median of "
        "the runs; the search returns the 50 most recent matching chats with a snippet each, "
        "the list shows the 200 most recent).\n\n" + table + "\n\n![search](search.png)\n",
        encoding="utf-8")
    return table


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [r["chats"] for r in rows]
    for name in QUERIES:
        ax.plot(x, [r[f"fts {name}"] for r in rows], marker="o", label=f"FTS5: {name}")
        ax.plot(x, [r[f"like {name}"] for r in rows], marker="x", linestyle="--",
                label=f"LIKE scan: {name}")
    ax.plot(x, [r["list"] + r["html"] for r in rows], marker="s", label="chat list + HTML")
    ax.set_xlabel("chats (10 messages each)")
    ax.set_ylabel("ms (median)")
    ax.set_yscale("log")
    ax.set_title("Search and chat list: time per request")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", default="1000,3000,10000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "search")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(int(n), args.runs, Path(folder)) for n in args.chats.split(",")]
    print(report(rows, args.out))


if __name__ == "__main__":
    main()
