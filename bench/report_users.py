"""The several-users scenario in the report: its table, method note, targets and plot.

report.py calls these; the shared helpers (tables, number formats, figures) are
report_format.py's.
"""

from __future__ import annotations

from pathlib import Path

from .report_format import log_ticks, save_figure, secs, table, target_row
from .servers import LLAMA_SERVER, REAME_SERIAL, REAME_SLOTS

COLORS = {REAME_SLOTS: "#1b7837", REAME_SERIAL: "#e08214", LLAMA_SERVER: "#2166ac"}
MARKERS = {REAME_SLOTS: "o", REAME_SERIAL: "s", LLAMA_SERVER: "^"}
TARGET_USERS, TARGET_P95_S, TARGET_TOK_RATIO = 4, 1.0, 0.9


def table_users(u: dict) -> str:
    rows = [[r["users"], r["system"], f"{r['requests']} ({r['overlapped']})"
             + (f", **{r['errors']} failed**" if r["errors"] else ""),
             secs(r["p50_s"]), secs(r["p95_s"]), secs(r["max_s"]), f"{r['tok_s']:,.1f}",
             "n/a" if r.get("vs_one") is None else f"{r['vs_one']:.2f}x",
             "n/a" if r.get("reply_tok_s") is None else f"{r['reply_tok_s']:,.1f}",
             f"{r['mean_tokens']:,.0f}", _prompt(r)] for r in u["rows"]]
    out = table(["users", "system", "requests (sent while a reply streamed)",
                 "first token p50 (s)", "p95 (s)", "max (s)", "aggregate tokens/s",
                 "vs 1 user", "one reply's tokens/s (median)", "tokens per reply",
                 "prompt tokens (reused)"], rows)
    missing = [f"- {kind}: {status}" for kind, status in u["systems"].items()
               if status != "measured"]
    return out + ("\n\nNot measured:\n\n" + "\n".join(missing) if missing else "")


def _prompt(row: dict) -> str:
    if row.get("prompt_tokens") is None:
        return "n/a"
    reused = "" if row.get("reused") is None else f" ({row['reused']:,.0f})"
    return f"{row['prompt_tokens']:,.0f}{reused}"


def note_users(u: dict) -> str:
    lines = [
        f"**Load**: {_counts(u['counts'])} clients at once, each in its own chat of about "
        f"{u['history_tokens']:,} tokens (filler from a fixed seed, different per client, the "
        f"system prompt included), asking {u['requests_per_client']} short question(s) one "
        "after another, each on the same history, through the `openai` SDK: "
        "/v1/chat/completions, stream=True, greedy, replies of at most "
        f"{u['max_tokens']} tokens. Client i starts {u['stagger_s']:g} x i s into the round.",
        "**Every chat was warmed once before the rounds** (its history sent, a reply of one "
        "token): a returning user, whose KV reame keeps on disk. llama-cpp-python's server "
        "keeps no cache: it got one short request instead." + _cold(u),
        "**Systems**: each a server process of its own, started side by side and measured "
        f"round by round. **reame**: `python app.py` of this checkout, no accounts, n_ctx "
        f"{u['n_ctx']:,}, `[model] slots = {u['slots']}` (`kv_ram_mb` and `[server] "
        "max_waiting` high enough that every slot is used and no request refused). **reame "
        "serial**: the same with `slots = 1`, one turn at a time (Reame before slots). "
        "**llama-cpp-python server**: `python -m llama_cpp.server`, n_ctx "
        f"{u['n_ctx']:,}, all cores, `--interrupt_requests False` (by default a new request "
        "ends the reply being streamed), `--logits_all False`, no cache (its default: only "
        "its live context is reused).",
        "**Measures**: first token from the request to the first streamed content token, seen "
        "by the client; p50/p95 over every request of the round (linear interpolation: with "
        "few requests p95 is close to the max). Aggregate tokens/s: the round's reply tokens "
        "over its wall time (first request to last reply's end); 'vs 1 user': over the same "
        "system's with one user. One reply's tokens/s: its tokens after the first over the "
        "time from its first token to its end. Prompt tokens and reused: medians, from "
        "reame's usage chunk.",
    ]
    if not u.get("slots_known"):
        lines.append("**This checkout does not read `[model] slots` yet: 'reame' ran one "
                     "turn at a time, like 'reame serial'.**")
    return "\n".join(f"- {line}" for line in lines)


def _cold(u: dict) -> str:
    """What the warm-up cost: the histories evaluated from nothing."""
    firsts = sorted(w["ttft_s"] for w in u.get("warm", [])
                    if w["system"] != LLAMA_SERVER and "ttft_s" in w)
    if not firsts:
        return ""
    return (f" The warm-up's first tokens (each history evaluated cold, one request at a "
            f"time): median {secs(firsts[len(firsts) // 2])} s.")


def _counts(counts: list[int]) -> str:
    """1, 2, 4 and 8."""
    words = [str(n) for n in counts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def targets_users(u: dict | None) -> list[dict]:
    """The issue's two targets, on reame (slots) with TARGET_USERS users."""
    if not u:
        return []
    out = []
    row = _row(u, REAME_SLOTS, TARGET_USERS)
    serial = _row(u, REAME_SERIAL, TARGET_USERS)
    if row and row["p95_s"] is not None:
        versus = f"; reame serial {secs(serial['p95_s'])} s" if serial else ""
        out.append(target_row(
            f"{TARGET_USERS} users: p95 first token of a short message on a "
            f"{u['history_tokens']:,}-token history at most {TARGET_P95_S:g} s while other "
            "replies stream (reame)", f"{secs(row['p95_s'])} s{versus}",
            row["p95_s"] <= TARGET_P95_S))
    if row and row.get("vs_one") is not None:
        alone = _row(u, REAME_SLOTS, 1)
        out.append(target_row(
            f"aggregate tokens/s with {TARGET_USERS} active replies at least "
            f"{TARGET_TOK_RATIO:g}x of one reply alone (reame)",
            f"{row['vs_one']:.2f}x ({row['tok_s']:,.1f} vs {alone['tok_s']:,.1f} tokens/s)",
            row["vs_one"] >= TARGET_TOK_RATIO))
    return out


def _row(u: dict, system: str, users: int) -> dict | None:
    return next((r for r in u["rows"] if r["system"] == system and r["users"] == users), None)


def plot_users(models: list[dict], path: Path) -> str:
    """p95 first token against the number of users, one line per system, a panel per model."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        u = model["scenarios"]["users"]
        values = [TARGET_P95_S]
        for kind in COLORS:
            pts = sorted((r["users"], r["p95_s"]) for r in u["rows"]
                         if r["system"] == kind and r["p95_s"] is not None)
            if pts:
                values += [p[1] for p in pts]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[kind],
                        color=COLORS[kind], label=kind, linewidth=2)
        ax.axhline(TARGET_P95_S, color="grey", linestyle="--", linewidth=1,
                   label=f"target at {TARGET_USERS} users")
        ax.set_xscale("log", base=2)
        ax.set_xticks(u["counts"])
        ax.set_xticklabels([str(n) for n in u["counts"]])
        ax.minorticks_off()
        ax.set_yscale("log")
        log_ticks(ax, values)
        ax.set_xlabel("users at once")
        ax.set_ylabel(f"p95 first token (s), {u['history_tokens']:,}-token history")
        ax.set_title(model["name"], fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle("Several users: p95 time to first token while others' replies stream")
    return save_figure(fig, path)


def table_batch(b: dict) -> str:
    """Scenario "batch": 4 replies decoded together, each on its own, and one alone."""
    rate = b["tokens_per_s"]
    rows = [["one reply alone", f"{rate['alone']:,.1f}", "1.00x", ""],
            [f"{b['slots']} replies, each token decoded on its own (exact_under_load)",
             f"{rate['in turn']:,.1f}", f"{b['in_turn_vs_alone']:.2f}x", "0 (always)"],
            [f"{b['slots']} replies decoded together (default)", f"{rate['batched']:,.1f}",
             f"{rate['batched'] / rate['alone']:.2f}x",
             f"{b['replies_differing']} of {b['replies_compared']}"]]
    return table(["way", "aggregate tokens/s", "vs alone", "replies differing from alone"],
                 rows)


def note_batch(b: dict) -> str:
    at = b["first_difference_at"]
    where = (f"; the differing ones first differ at token {', '.join(map(str, at))}"
             if at else "")
    return (f"One engine with {b['slots']} slots, each holding its own {b['history']:,}-token "
            f"history; {b['steps']} greedy tokens per reply, the three ways alternated, best of "
            f"{b['runs']}. Replies compared: each reply under load against the same reply "
            f"alone, token for token, over {b['replies_compared']} replies{where}.")
