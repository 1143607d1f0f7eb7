"""Results -> markdown tables (results.md, also printed) and PNG plots."""

from __future__ import annotations

from pathlib import Path

from .report_format import (  # noqa: F401 (report.table and friends: the benchmarks' names)
    load_average,
    log_ticks,
    machine_info,
    mb,
    pct,
    ratio,
    save_figure,
    secs,
    table,
    target_row,
)

from .systems import (
    DISK_CACHE,
    MB,
    NO_CACHE,
    PAGE_VARIANTS,
    REAME,
    REAME_OPENED,
    REAME_TYPED,
    SYSTEMS,
)

COLORS = {REAME: "#1b7837", NO_CACHE: "#b2182b", DISK_CACHE: "#2166ac"}
MARKERS = {REAME: "o", NO_CACHE: "s", DISK_CACHE: "^"}


def rss(row: dict) -> str:
    return f"{mb(row['peak_rss'])} (+{mb(row['rss_growth'])})"


def _by(rows: list[dict], **match) -> dict | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


# scenario tables


def table_s1(s1: dict) -> str:
    rows = []
    for row in s1["rows"]:
        reame = _by(s1["rows"], size=row["size"], system=REAME)
        speedup = ratio(reame["ttft_s"], row["ttft_s"]) if reame and row is not reame else "1x"
        spread = (f" [{secs(row['ttft_min_s'])}-{secs(row['ttft_max_s'])}]"
                  if row["turns"] > 1 else "")
        rows.append([
            f"{row['size']:,}", row["system"], secs(row["ttft_s"]) + spread,
            speedup if row["system"] not in (REAME, *PAGE_VARIANTS) else "-",
            f"{row['evaluated']:,.0f}", f"{row['reused']:,.0f} ({', '.join(row['sources'])})",
            f"{row['restore_ms']:,.0f}", f"{row['save_ms']:,.0f}", mb(row["bytes_written"]), rss(row),
        ])
    return table(["history (tokens)", "system", "first token (s)", "reame faster by",
                  "tokens evaluated", "reused (from)", "restore ms", "save ms", "MB written",
                  "peak RSS MB (+growth)"], rows)


def table_s1_parts(s1: dict) -> str:
    """Where the first token's time goes: restore, prefill of the new tokens, the rest."""
    rows = []
    for row in s1["rows"]:
        if row["system"] == NO_CACHE or not row.get("prefill_ms"):
            continue
        ttft_ms = row["ttft_s"] * 1000
        rest = ttft_ms - row["restore_ms"] - row["prefill_ms"]
        rows.append([f"{row['size']:,}", row["system"], f"{ttft_ms:,.0f}",
                     f"{row['restore_ms']:,.0f}",
                     f"{row['prefill_ms']:,.0f} ({row['prefilled']:,.0f})", f"{rest:,.0f}"])
    return table(["history (tokens)", "system", "first token ms (median)", "restore ms",
                  "prefill ms (new tokens)", "the rest ms"], rows)


def s1_floor(s1: dict) -> list[str]:
    """What no cache can remove: the new tokens' prefill over the history, and its growth."""
    lo, hi = min(s1["sizes"]), max(s1["sizes"])
    a, b = _by(s1["rows"], size=lo, system=REAME), _by(s1["rows"], size=hi, system=REAME)
    out = []
    if a and b and lo != hi and a.get("prefill_ms"):
        out.append(
            f"The prefill of the new message alone ({a['prefilled']:,.0f} tokens, the same for "
            f"every size) grows {b['prefill_ms'] / a['prefill_ms']:.2f}x from {lo:,} to {hi:,} "
            f"history tokens ({a['prefill_ms']:,.0f} -> {b['prefill_ms']:,.0f} ms): each new "
            "token attends over the whole history, and on a model this small that attention "
            "costs about as much as the weights at a few thousand tokens. A restore of zero ms "
            "would leave this growth, so it is the floor of any cache here.")
    size = 2000 if 2000 in s1["sizes"] else hi
    reame, ldc = _by(s1["rows"], size=size, system=REAME), _by(s1["rows"], size=size,
                                                               system=DISK_CACHE)
    if reame and ldc and reame.get("prefill_ms"):
        out.append(
            f"At {size:,} tokens, LlamaDiskCache's first token ({secs(ldc['ttft_s'])} s) over "
            f"reame's prefill alone ({reame['prefill_ms']:,.0f} ms) is "
            f"{ldc['ttft_s'] * 1000 / reame['prefill_ms']:.1f}x: the most any restore, however "
            "fast, could make of the ratio between the two.")
    return out


def table_s2(s2: dict) -> str:
    rows = [[r["system"], secs(r["ttft_s"]), f"{secs(r['ttft_min_s'])}-{secs(r['ttft_max_s'])}",
             secs(r["sum_total_s"]), f"{r['sum_evaluated']:,}", mb(r["sum_bytes_written"]),
             rss(r), ", ".join(r["sources"])] for r in s2["rows"]]
    return table(["system", "median first token (s)", "range (s)",
                  f"time of all {s2['rows'][0]['turns']} turns (s)", "tokens evaluated (all)",
                  "MB written (all)", "peak RSS MB (+growth)", "sources"], rows)


def table_s3(s3: dict) -> str:
    rows = [[r["variant"], r["system"], secs(r["first_chat_ttft_s"]), secs(r["ttft_s"]),
             f"{r['reused']:,.0f} ({', '.join(r['sources'])})", f"{r['all_evaluated']:,}",
             mb(r["all_bytes_written"]), rss(r)] for r in s3["rows"]]
    return table(["variant", "system", "first chat: first token (s)",
                  "later chats: median first token (s)", "later chats: reused (from)",
                  "tokens evaluated (all chats)", "MB written (all chats)",
                  "peak RSS MB (+growth)"], rows)


def table_s4(s4: dict) -> str:
    rows = [[r["system"], secs(r["mean_total_s"]), secs(r["total_s"]), pct(r["overhead"]),
             secs(r["ttft_s"]), f"{r['save_ms']:,.0f}", f"{r['save_share'] * 100:.1f} %",
             mb(r["bytes_written"]), rss(r)] for r in s4["rows"]]
    return table(["system", "mean turn (s)", "median turn (s)", "vs no cache",
                  "median first token (s)", "median save ms", "save share of the turn",
                  "MB written per turn", "peak RSS MB (+growth)"], rows)


def table_s5(s5: dict) -> str:
    rows = []
    for r in s5["rows"]:
        reame = _by(s5["rows"], variant=r["variant"], system=REAME)
        rows.append([r["variant"], r["system"], secs(r["ttft_s"]),
                     ratio(reame["ttft_s"], r["ttft_s"]) if r["system"] != REAME else "-",
                     f"{r['reused']:,.0f} ({', '.join(r['sources'])})", f"{r['prefilled']:,.0f}",
                     f"{r['evaluated']:,.0f}", mb(r["bytes_written"]), rss(r)])
    return table(["variant", "system", "first token (s)", "reame faster by", "reused (from)",
                  "prompt tokens evaluated", "tokens evaluated", "MB written",
                  "peak RSS MB (+growth)"], rows)


def table_s6(s6: dict) -> str:
    base = _by(s6["rows"], system=NO_CACHE)
    rows = [[r["system"], secs(r["sum_total_s"]),
             f"{r['sum_total_s'] / base['sum_total_s']:.2f}" if base else "n/a",
             secs(r["ttft_s"]), f"{r['sum_evaluated']:,}", mb(r["sum_bytes_written"]), rss(r),
             f"{r['save_share'] * 100:.1f} %"] for r in s6["rows"]]
    return table(["system", "cumulative turn time (s)", "share of no cache's",
                  "median first token (s)", "tokens evaluated (all)", "MB written (all)",
                  "peak RSS MB (+growth)", "median save share"], rows)


def table_s7(s7: dict) -> str:
    rows = [[r["variant"], secs(r["sum_total_s"]), secs(r["mean_total_s"]),
             secs(r.get("median_total_s")),
             f"{r['overflows']} ({r['shifted']} shifted, {r['recomputed']} re-evaluated)",
             secs(r["overflow_ttft_s"]), _count(r["overflow_evaluated"]),
             secs(r["other_ttft_s"]), _count(r["other_evaluated"]),
             f"{r['replies']} of {r['turns']}"] for r in s7["rows"]]
    return table(["variant", f"time of all {s7['chat_turns']} turns (s)", "mean turn (s)",
                  "median turn (s)", "overflows", "overflow turns: median first token (s)",
                  "overflow turns: median tokens evaluated", "other turns: median first token (s)",
                  "other turns: median tokens evaluated", "non-empty replies"], rows)


def _count(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def table_plan(plan: dict) -> str:
    rows = [[f"{r['history']:,}", f"{r['turn_one_ms']:,.0f}", f"{r['turn_plan_ms']:,.0f}",
             f"{r['turn_added_ms']:+,.0f}", secs(r["cold_one_s"]), secs(r["cold_plan_s"]),
             f"{r['cold_ratio']:.2f}x"] for r in plan["rows"]]
    return table(["history tokens", "turn: one decode (ms)", "turn: plan (ms)",
                  "added to the first token (ms)", "cold prompt: one decode (s)",
                  "cold prompt: plan (s)", "plan / one decode"], rows)


def table_kv(kv: dict) -> str:
    rows = [[r["kv_type"], f"{r['bytes_per_token']:,.0f}", f"{r['bytes_per_token'] / 1024:,.1f}",
             f"{r['mb_per_1000_tokens']:,.1f}", f"{r['fixed_bytes']:,.0f}"] for r in kv["rows"]]
    return table(["KV type", "bytes per token", "KiB per token", "MB per 1,000 tokens",
                  "fixed bytes per state"], rows)


def table_restore(rt: dict) -> str:
    rows = [[r["step"], f"{r['ms']:,.1f}", f"{r['mb_per_s']:,.0f}"] for r in rt["rows"]]
    return table(["step (median of %d)" % rt["reps"], "ms", "MB/s"], rows)


def tablesave_figure(ss: dict) -> str:
    rows = [[r["scenario"], r["turns"], f"{r['save_ms']:,.1f}", f"{r['share'] * 100:.1f} %",
             f"{r['max_share'] * 100:.1f} %", f"{r.get('write_ms', 0):,.0f}",
             f"{r['mb_per_s']:,.0f}"] for r in ss["rows"]]
    return table(["scenario", "reame turns", "median save ms in the turn",
                  "median share of the turn", "max share", "median background write ms",
                  "MB/s written"], rows)


# targets


def targets(res: dict) -> list[dict]:
    """The report's targets: measured value and hit / missed (never asserted)."""
    out = []
    s1 = res.get("s1")
    if s1:
        size = 2000 if 2000 in s1["sizes"] else max(s1["sizes"])
        reame, none, ldc = (_by(s1["rows"], size=size, system=k) for k in SYSTEMS)
        if reame and none:
            x = none["ttft_s"] / reame["ttft_s"]
            out.append(target_row(f"restart at {size:,} tokens: reame >= 20x faster to first token "
                               "than no cache", f"{x:,.1f}x ({secs(reame['ttft_s'])} s vs "
                               f"{secs(none['ttft_s'])} s)", x >= 20))
        if reame and ldc:
            x = ldc["ttft_s"] / reame["ttft_s"]
            out.append(target_row(f"restart at {size:,} tokens: reame >= 5x faster than "
                               "LlamaDiskCache", f"{x:,.1f}x ({secs(reame['ttft_s'])} s vs "
                               f"{secs(ldc['ttft_s'])} s)", x >= 5))
        for variant, how in ((REAME_OPENED, "the chat opened before the message (the page "
                                            "restores its KV on opening)"),
                             (REAME_TYPED, "the chat opened and the message typed ahead (the "
                                           "page's path)")):
            page = _by(s1["rows"], size=size, system=variant)
            if page and ldc:
                x = ldc["ttft_s"] / page["ttft_s"]
                out.append(target_row(f"the same, with {how}", f"{x:,.1f}x "
                                   f"({secs(page['ttft_s'])} s vs {secs(ldc['ttft_s'])} s)",
                                   x >= 5))
        lo, hi = min(s1["sizes"]), max(s1["sizes"])
        for variant, name in ((REAME, "reame's first token"),
                              (REAME_TYPED, "the same on the page's path")):
            a, b = _by(s1["rows"], size=lo, system=variant), _by(s1["rows"], size=hi,
                                                                  system=variant)
            if a and b and lo != hi:
                x = b["ttft_s"] / a["ttft_s"]
                out.append(target_row(f"{name} grows at most 2x from {lo:,} to {hi:,} tokens",
                                   f"{x:.2f}x ({secs(a['ttft_s'])} s -> "
                                   f"{secs(b['ttft_s'])} s)", x <= 2))
    rt = res.get("restore")
    if rt and rt.get("ratio"):
        out.append(target_row("restore (read + restore) within 2x of a plain read of the file",
                           f"{rt['ratio']:.2f}x ({rt['tokens']:,}-token file, "
                           f"{rt['file_bytes'] / MB:.1f} MB)", rt["ratio"] <= 2))
    s4 = res.get("s4")
    if s4:
        reame = _by(s4["rows"], system=REAME)
        if reame and reame["overhead"] is not None:
            out.append(target_row("low overlap: reame within 10 % of no cache (mean turn time)",
                               pct(reame["overhead"]), reame["overhead"] <= 0.10))
    s6 = res.get("s6")
    if s6:
        reame, none = _by(s6["rows"], system=REAME), _by(s6["rows"], system=NO_CACHE)
        if reame and none:
            x = reame["sum_total_s"] / none["sum_total_s"]
            out.append(target_row("over time: reame's cumulative time at most 1/3 of no cache's",
                               f"{x:.2f} ({secs(reame['sum_total_s'])} s vs "
                               f"{secs(none['sum_total_s'])} s)", x <= 1 / 3))
    from .report_users import targets_users

    return out + targets_users(res.get("users"))


def table_targets(items: list[dict]) -> str:
    return table(["target", "measured", ""],
                 [[t["target"], t["measured"], "hit" if t["hit"] else "**missed**"] for t in items])


# findings computed from the turns


def findings(sc: dict) -> list[str]:
    """Facts worth a line that the tables do not show directly."""
    out = []
    ldc = [t for t in sc.get("s2", {}).get("turns", []) if t["system"] == DISK_CACHE]
    if ldc:
        most = max(t["extra"].get("cache_entries_after", 0) for t in ldc)
        full = sum(1 for t in ldc if t["reused"] > 0.5 * t["prompt_tokens"])
        out.append(
            f"LlamaDiskCache held at most {most} entr{'y' if most == 1 else 'ies'} while switching "
            f"between chats: only {full} of its {len(ldc)} turns in scenario 2 reused most of "
            "the history. `LlamaDiskCache.__getitem__` pops the entry with the longest common "
            "prefix before `Llama` decides whether to load it, so a new prompt that shares only "
            "the chat template's system header with another chat deletes that chat's entry.")
    s1 = sc.get("s1")
    if s1:
        rows = [r for r in s1["rows"] if r["system"] == DISK_CACHE]
        if rows:
            big = max(rows, key=lambda r: r["size"])
            out.append(
                f"LlamaDiskCache writes {mb(big['bytes_written'])} MB per turn at "
                f"{big['size']:,} tokens (its pickled `LlamaState` carries the logits of up to "
                f"n_batch tokens), and its peak RSS grows by {mb(big['rss_growth'])} MB during "
                "the turn (the entry is unpickled, then copied into the context).")
    s7 = sc.get("s7")
    if s7:
        shift, full = (_by(s7["rows"], variant=v) for v in ("shift", "re-evaluate"))
        if shift and full and shift["overflow_ttft_s"] and full["overflow_ttft_s"]:
            a, b = shift["overflow_ttft_s"], full["overflow_ttft_s"]
            x = f"{b / a:,.1f}x sooner" if a <= b else f"{a / b:,.1f}x later"
            out.append(
                f"Long chat (n_ctx {s7['n_ctx']:,}, {s7['chat_turns']} turns): at an overflow, "
                f"the shift's first token came {x} than a re-evaluation's "
                f"(median {secs(shift['overflow_ttft_s'])} s vs "
                f"{secs(full['overflow_ttft_s'])} s; {_count(shift['overflow_evaluated'])} vs "
                f"{_count(full['overflow_evaluated'])} tokens evaluated); all turns together "
                f"{secs(shift['sum_total_s'])} s vs {secs(full['sum_total_s'])} s.")
        elif shift and full:
            out.append(f"Long chat: no overflow in {s7['chat_turns']} turns at n_ctx "
                       f"{s7['n_ctx']:,}, so the shift was not measured.")
    return out


def _note_s7(d: dict) -> str:
    differ = d.get("first_different_reply")
    low, high = d["message_tokens"]
    shift = d.get("can_shift", {}).get("shift", True)
    return (
        f"One chat of {d['chat_turns']} turns at n_ctx {d['n_ctx']:,} (not the other scenarios' "
        f"context), user messages of {low}-{high} tokens (filler, fixed seed), replies of at "
        f"most {d['max_tokens']} tokens. When the next turn would not fit with room for the "
        "reply, `ChatService` drops the oldest messages from the chat's window (enough for a few "
        "more turns): an **overflow** turn. reame (cache on) twice, side by side, taking each "
        "turn in turn: **shift** (the default: the KV of the dropped messages is removed and the "
        "rest moved down, nothing recomputed) and **re-evaluate** (`engine.can_shift = False`: "
        "the kept window is evaluated again). Overflow turns are those whose `TurnStats` say "
        "`shifted` or `window_recomputed`; tokens evaluated include the reply's. "
        + ("" if shift else "**This model cannot shift its KV: both variants re-evaluate.** ")
        + f"The two variants gave the same reply in {d['same_replies']} of {d['chat_turns']} "
        "turns" + (f" (the first difference at turn {differ}; after it the histories differ)."
                   if differ else ".")
    )


# the whole report


def markdown(results: dict, plots: list[str]) -> str:
    """results.md: run info, method notes, targets, one table per scenario."""
    from .report_users import note_batch, note_users, table_batch, table_users

    info, run = results["machine"], results["run"]
    main = results["models"][0]
    parts = [
        "# Reame benchmark results", "",
        f"- date: {run['date']}  ",
        f"- command: `{run['command']}` ({'quick' if run['quick'] else 'full'} run, "
        f"{run['wall_s'] / 60:.1f} min" + (f", {run['cpu_s'] / 60:.1f} min of CPU"
                                          if run.get("cpu_s") else "") + (f"; **partial: still to run: "
                                          f"{', '.join(run['pending'])}**" if run.get('pending')
                                          else "") + ")  ",
        f"- machine: {info['cpu']} ({info['arch']}), {info['cores']} cores, "
        f"{info['ram_gb']} GB RAM, {info['os']}  ",
        f"- load average (1/5/15 min) at start: {run['load_start']}; at end: {run['load_end']}  ",
        f"- llama-cpp-python {info['llama_cpp_python']}, Python {info['python']}  ",
        "- models: " + "; ".join(f"{m['name']} ({m['bytes'] / MB:,.0f} MB{m.get('note', '')})"
                                  for m in results["models"]) + "  ",
        f"- every system: n_ctx {run['n_ctx']}, n_batch 512, "
        f"{str(run['threads']) + ' llama.cpp thread(s)' if run.get('threads') else 'all cores'}"
        ", f16 KV, greedy "
        f"(temperature 0), replies of at most {run['max_tokens']} tokens unless said",
        "", "## How it is measured", "",
        "- **reame**: `ChatService` with `KVCache(engine, KVStore(...))` in a temp folder. "
        "**no cache**: the same `ChatService` with `KVCache(engine, None)` (only the live "
        "context is reused). **LlamaDiskCache**: `Llama.set_cache(LlamaDiskCache(cache_dir=...))` "
        "and `create_chat_completion(stream=True)`; chats kept in a JSON file.",
        "- **Restart** = a new engine, database and cache objects (a new `Llama` for "
        "LlamaDiskCache) built over the same folder in the same Python process: the in-memory "
        "context is gone, the files remain. The files were just written, so they are in the OS "
        "page cache: this measures CPU and memory work, not a cold disk. Model loading is not "
        "counted in any time.",
        "- Histories are filler messages from a fixed seed inserted into the store directly, then "
        "one real turn writes the chat's KV (reame) or cache entry (LlamaDiskCache); the next "
        "turn is measured. no cache runs on a copy of reame's database (same messages, same "
        "reply tokens) without the KV folder.",
        "- **first token**: from the call (`ChatService.send` / `create_chat_completion`) to the "
        "first streamed token, so restore, prefill and the first sample are in it.",
        "- **tokens evaluated**: the `Engine.evaluated` delta for reame and no cache; for "
        "LlamaDiskCache a `Llama` subclass records every `eval()` call with its `n_tokens` "
        "before the call (the reused prefix) and the number of tokens decoded. Both count the "
        "prompt tokens evaluated plus the reply tokens fed back.",
        "- **MB written**: bytes this process passed to `write()` during the turn "
        "(psutil `io_counters().write_chars`: KV files, SQLite, diskcache, a few bytes of logs).",
        "- **peak RSS**: of this whole Python process (psutil / Linux VmHWM, reset before each "
        "turn through /proc/self/clear_refs), so it includes the loaded model and its context; "
        "(+growth) is the peak minus the RSS just before the turn. It is per process: in "
        "scenarios 2, 3, 4 and 6 the three systems (in 7 the two variants) are loaded side by "
        "side in this process (they take each step in turn, so that a change in the machine's "
        "load hits them alike), so there only the growth is one system's.",
        "", "## Targets (reported, not asserted)", "",
        table_targets(results["targets"]) if results["targets"] else "_none measured_",
    ]
    sc = main["scenarios"]
    sections = [
        ("s1", "1. Restart and continue", table_s1,
         lambda d: f"Median of {d['runs']} run(s) per size; the restart is just before the "
                   "measured turn."),
        ("s2", "2. Switching between chats", table_s2,
         lambda d: f"{d['chats']} chats of about {d['tokens']:,} tokens, answered in turn for "
                   f"{d['rounds']} rounds in one process (each chat had one turn before, in an "
                   "earlier process; no restart during the rounds)."),
        ("s3", "3. Shared prefix", table_s3,
         lambda d: f"{d['chats']} new chats with the same system prompt of {d['prefix_tokens']:,}"
                   " tokens. 'one process': consecutive chats (the live context already holds "
                   "the prefix, for every system); 'restart before each chat': only what is on "
                   "disk helps."),
        ("s4", "4. Low overlap (the cost of saving)", table_s4,
         lambda d: f"{d['prompts']} unrelated single-turn prompts, each a new chat (replies of at "
                   f"most {d['max_tokens']} tokens); only the chat template's system header is shared."),
        ("s5", "5. Edit in the middle", table_s5,
         lambda d: f"A {d['turns_in_chat']}-turn chat; the 3rd user message is edited and "
                   "resent (what followed it is dropped). 'same process': the chat's last turn "
                   "was just answered in this process; 'after a restart': new process."),
        ("s6", "6. Over time", table_s6,
         lambda d: f"A scripted day of {d['day_turns']} turns across {d['day_chats']} chats (half "
                   f"the time the user stays in the same chat), a restart every "
                   f"{d['restart_every']} turns, replies of at most {d['max_tokens']} tokens; each chat "
                   "had one turn the day before. "
                   "Cumulative time = the sum of the turns' times (restarts themselves not "
                   "counted). reame vs no cache only: LlamaDiskCache keeps about one entry once "
                   "several chats share a system prompt (see the notes), so it would measure "
                   "like no cache plus its saves."),
        ("s7", "7. Long chat (context shift)", table_s7, _note_s7),
        ("users", "8. Several users (server processes over HTTP)", table_users, note_users),
        ("batch", "Several replies on one engine: decoded together or each on its own",
         table_batch, note_batch),
    ]
    for key, title, render, note in sections:
        if key in sc:
            parts += ["", f"## {title}", "", note(sc[key]), "", render(sc[key])]
        if key == "s1" and key in sc:
            parts += ["", "Where the first token's time goes (medians; the rest is tokenizing, "
                      "the database, the cache lookup and the first sample):", "",
                      table_s1_parts(sc[key]), ""] + [f"- {line}" for line in s1_floor(sc[key])]
    if "kv" in sc:
        parts += ["", "## KV bytes per token", "",
                  f"`llama_state_seq_get_data` size, slope between {sc['kv']['probe_tokens'][0]} "
                  f"and {sc['kv']['probe_tokens'][1]} tokens (q8_0 turns flash attention on).",
                  "", table_kv(sc["kv"])]
    if "restore" in sc:
        rt = sc["restore"]
        decode = "; ".join(f"{k}: {v:,.0f} ms" for k, v in rt.get("decode_ms", {}).items())
        parts += ["", "## Restore throughput", "",
                  f"A {rt['tokens']:,}-token reame KV file ({rt['file_bytes'] / MB:.1f} MB), "
                  f"context of {rt['n_ctx']:,} tokens. The file is read once before, so every "
                  "step is warm (dropping the page cache needs root): the comparison is CPU and "
                  "memory work, not the disk. read + restore / plain read: reame "
                  f"{rt['ratio']:.2f}x; the path before the rework (see "
                  f"bench/restore_profile.py) {rt['before_ratio']:.2f}x.",
                  "", table_restore(rt), "",
                  f"The other part of the first token after a restore is the prefill of the new "
                  f"message ({rt['new_tokens']} tokens) on top of the restored KV: {decode}."]
    if "plan" in sc:
        plan = sc["plan"]
        parts += ["", "## The batch plan's cost", "",
                  f"Every prompt is evaluated in chunks of {plan['chunk']} tokens at absolute "
                  "positions, so that the reply never depends on what the "
                  "cache held (docs/cache.md, \"Same request, same reply\"). Side by side on one "
                  f"engine, median of {plan['runs']}: a turn's new tokens "
                  f"({plan['rows'][0]['new_tokens']}: a message and the reply header) on top of "
                  "the history, until the first token's logits; and a cold prompt of the "
                  "history's length. 'One decode' is the evaluation before the plan (up to 512 "
                  "tokens per decode).", "", table_plan(plan)]
    if "save" in sc and sc["save"]["rows"]:
        parts += ["", "## Save time per turn (reame)", "",
                  "`save_ms`: what the turn spends saving (copying the KV state out of "
                  "llama.cpp and queueing it), over the whole turn time. The file itself (temp "
                  "file, fsync, rename) is written by a background thread after the reply: "
                  "'background write ms'; the benchmark waits for it, untimed, before the next "
                  "step. MB/s = bytes written / background write time.", "",
                  tablesave_figure(sc["save"])]
    for model in results["models"][1:]:
        parts += ["", f"## Larger shape: {model['name']}", "", model.get("description", "")]
        if "s1" in model["scenarios"]:
            parts += ["", f"Shortened: scenario 1, sizes "
                      f"{', '.join(str(s) for s in model['scenarios']['s1']['sizes'])}, "
                      f"{model['scenarios']['s1']['runs']} run each.", ""]
        if "kv" in model["scenarios"]:
            parts += [table_kv(model["scenarios"]["kv"]), ""]
        if "s1" in model["scenarios"]:
            parts += [table_s1(model["scenarios"]["s1"])]
        if "batch" in model["scenarios"]:
            parts += ["", "Several replies on one engine (this shape):", "",
                      table_batch(model["scenarios"]["batch"])]
        if "users" in model["scenarios"]:
            parts += ["", "Several users (scenario 8 on this shape):", "",
                      table_users(model["scenarios"]["users"])]
    if results.get("notes"):
        parts += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"


# plots


def plots(results: dict, out: Path) -> list[str]:
    """Write the PNGs; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    names = []
    models = [m for m in results["models"] if "s1" in m["scenarios"]]
    if models:
        names.append(plot_ttft(models, out / "ttft_vs_history.png"))
    main = results["models"][0]["scenarios"]
    if "s6" in main:
        names.append(plot_over_time(main["s6"], out / "over_time.png"))
    if "s4" in main:
        names.append(plot_low_overlap(main["s4"], out / "low_overlap.png"))
    if "s7" in main:
        names.append(plot_long_chat(main["s7"], out / "long_chat.png"))
    if "plan" in main:
        names.append(plot_plan(main["plan"], out / "batch_plan.png"))
    crowded = [m for m in results["models"] if "users" in m["scenarios"]]
    if crowded:
        from .report_users import plot_users

        names.append(plot_users(crowded, out / "users_first_token.png"))
    return names


def plot_plan(plan: dict, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [r["history"] for r in plan["rows"]]
    for key, label, color in (("turn_one_ms", "one decode (before)", "grey"),
                              ("turn_plan_ms", f"plan: chunks of {plan['chunk']} at absolute positions",
                               "tab:blue")):
        ax.plot(xs, [r[key] for r in plan["rows"]], marker="o", color=color, label=label)
    ax.set_xlabel("history tokens in the KV")
    ax.set_ylabel(f"first token's logits after {plan['rows'][0]['new_tokens']} new tokens (ms)")
    ax.set_title("What the batch plan adds to a turn's first token")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return save_figure(fig, path)


def plot_ttft(models: list[dict], path: Path) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = model["scenarios"]["s1"]["rows"]
        for kind in (*SYSTEMS, REAME_TYPED):
            pts = sorted((r["size"], r["ttft_s"]) for r in rows if r["system"] == kind)
            base = REAME if kind == REAME_TYPED else kind  # the page's path: reame, dashed
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[base],
                        color=COLORS[base], label=kind, linewidth=2,
                        linestyle="--" if kind == REAME_TYPED else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
        sizes = sorted({r["size"] for r in rows})
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{s:,}" for s in sizes])
        ax.minorticks_off()
        log_ticks(ax, [r["ttft_s"] for r in rows])
        ax.set_xlabel("history before the new message (tokens)")
        ax.set_ylabel("time to first token after a restart (s)")
        ax.set_title(model["name"], fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
    fig.suptitle("Restart and continue: time to first token (log-log)")
    return save_figure(fig, path)


def plot_over_time(s6: dict, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for kind, curve in s6["curves"].items():
        ax.plot(range(1, len(curve) + 1), curve, color=COLORS[kind], label=f"{kind} "
                f"({curve[-1]:,.0f} s)", linewidth=2)
    for i, at in enumerate(s6["restart_at"]):
        ax.axvline(at + 0.5, color="grey", linestyle="--", linewidth=1,
                   label="restart" if i == 0 else None)
    ax.set_xlabel("turn")
    ax.set_ylabel("cumulative turn time (s)")
    ax.set_title(f"A scripted day: {s6['day_turns']} turns across {s6['day_chats']} chats, "
                 f"restart every {s6['restart_every']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_low_overlap(s4: dict, path: Path) -> str:
    import matplotlib.pyplot as plt

    per = s4["per_prompt"]
    kinds = [k for k in SYSTEMS if k in per]
    n = len(next(iter(per.values())))
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, kind in enumerate(kinds):
        row = _by(s4["rows"], system=kind)
        saves = [t["save_ms"] / 1000 for t in s4.get("turns", []) if t["system"] == kind]
        saves = saves if len(saves) == n else [0.0] * n
        label = kind + (f" (mean {pct(row['overhead'])} vs no cache)" if kind != NO_CACHE else "")
        xs = [p + i * width for p in range(n)]
        ax.bar(xs, [t - sv for t, sv in zip(per[kind], saves)], width, color=COLORS[kind],
               label=label)
        if any(saves):
            ax.bar(xs, saves, width, bottom=[t - sv for t, sv in zip(per[kind], saves)],
                   color="black", alpha=0.55, label="saving (KV file / cache entry)" if i == 0
                   or kind == DISK_CACHE and REAME not in kinds else None)
    ax.set_xticks([p + width * (len(kinds) - 1) / 2 for p in range(n)])
    ax.set_xticklabels([str(p + 1) for p in range(n)])
    ax.set_xlabel("unrelated prompt (a new chat each)")
    ax.set_ylabel("turn time, saving included (s)")
    ax.set_title("Low overlap: the cost of saving when nothing is reused")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    return save_figure(fig, path)


LONG_COLORS = {"shift": COLORS[REAME], "re-evaluate": "#762a83"}


def plot_long_chat(s7: dict, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    values = []
    for row in s7["rows"]:
        variant = row["variant"]
        color = LONG_COLORS.get(variant, "grey")
        turns = [t for t in s7["turns"] if t["system"] == variant]
        xs, ys = [t["turn"] for t in turns], [t["ttft_s"] for t in turns]
        values += ys
        ax.plot(xs, ys, color=color, linewidth=1.5, marker=".", markersize=4,
                label=f"{variant} (all turns {secs(row['sum_total_s'])} s)")
        over = [t for t in turns if t["overflow"]]
        if over:
            ax.scatter([t["turn"] for t in over], [t["ttft_s"] for t in over], s=60,
                       facecolors="none", edgecolors=color, linewidths=1.8, zorder=3,
                       label=f"overflow, {variant} ({len(over)})")
    ax.set_yscale("log")
    if values:
        log_ticks(ax, values)
    ax.xaxis.set_major_locator(__import__("matplotlib").ticker.MaxNLocator(integer=True))
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token (s, log)")
    ax.set_title(f"Long chat: {s7['chat_turns']} turns at n_ctx {s7['n_ctx']:,}, "
                 "KV shifted vs window re-evaluated at each overflow")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9)
    return save_figure(fig, path)
