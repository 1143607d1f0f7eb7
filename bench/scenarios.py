"""The benchmark's scenarios. Each returns plain data (dicts, lists) that report.py renders.

Histories are inserted into each system's store directly (filler text from a fixed seed), then
one real turn writes the chat's KV (reame) or cache entry (LlamaDiskCache); the turn after
that is the one measured. "no cache" runs on a copy of reame's database (the same messages,
the same exact reply tokens) without the KV folder. A restart builds a new engine, database
and cache objects over the same folder in this Python process: the in-memory context is gone,
the files remain (and are in the OS page cache, having just been written).
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import workload
from .servers import LLAMA_SERVER, REAME_SERIAL, REAME_SLOTS
from .systems import (
    DISK_CACHE,
    MB,
    NO_CACHE,
    PAGE_VARIANTS,
    REAME,
    REAME_TYPED,
    SYSTEMS,
    ServiceSystem,
    System,
    TurnResult,
    make_system,
)

log = logging.getLogger(__name__)

BUILD_MESSAGE = "Thank you. Please summarise what we discussed in one sentence."
NEXT_MESSAGE = "One more question: what should I read next?"
# Tokens around the inserted pairs: system prompt, the build turn and its reply.
HISTORY_OVERHEAD = 45


@dataclass(frozen=True)
class Plan:
    """What to run: sizes, counts and repetitions (the full run or --quick)."""

    quick: bool = False
    runs: int = 3
    threads: int = 0  # llama.cpp threads per system; 0 = all cores (reame's default)
    max_tokens: int = 8
    n_ctx: int = 8192
    sizes: tuple[int, ...] = (250, 500, 1000, 2000, 4000)
    switch_chats: int = 4
    switch_tokens: int = 1000
    switch_rounds: int = 3
    prefix_chats: int = 10
    prefix_tokens: int = 1000
    low_overlap_prompts: int = 8
    low_overlap_words: int = 120
    low_overlap_max_tokens: int = 16
    edit_turns: int = 6
    edit_pair_words: tuple[int, int] = (60, 110)
    day_turns: int = 60
    day_chats: int = 8
    day_restart_every: int = 15
    day_history: tuple[int, ...] = (200, 400, 600, 800, 1000, 300, 500, 700)
    day_max_tokens: int = 16
    # The brief's comparison; LlamaDiskCache behaves like no cache here (a lookup pops the
    # entry it finds, so with several chats it keeps about one) and would double the run.
    day_systems: tuple[str, ...] = (REAME, NO_CACHE)
    restore_tokens: int = 2000
    restore_reps: int = 5
    kv_probe_tokens: tuple[int, int] = (64, 192)
    # 7. one long chat at a small context: the oldest messages leave the window at overflows
    long_n_ctx: int = 2048
    long_turns: int = 100
    long_words: tuple[int, int] = (48, 75)  # per user message: about 60 to 100 tokens
    long_max_tokens: int = 32
    # 8. several users (bench/users.py): server processes over HTTP
    users: tuple[int, ...] = (1, 2, 4, 8)
    users_requests: int = 3  # per client, one after another
    users_history: int = 1000  # tokens of each client's chat before its question
    users_max_tokens: int = 200
    users_n_ctx: int = 2048
    users_stagger_s: float = 0.5  # client i starts i * this into a round
    users_systems: tuple[str, ...] = (REAME_SLOTS, REAME_SERIAL, LLAMA_SERVER)
    # batch (bench/batching.py): 4 replies decoded together vs each on its own vs one alone
    batch_history: int = 1000
    batch_steps: int = 64
    batch_rounds: int = 8  # x 4 replies compared with the same replies alone

    @classmethod
    def quick_plan(cls) -> "Plan":
        return cls(quick=True, runs=1, sizes=(250, 1000), switch_chats=2, switch_tokens=150,
                   switch_rounds=2, prefix_chats=3, prefix_tokens=128, low_overlap_prompts=3,
                   low_overlap_words=30, low_overlap_max_tokens=8, edit_pair_words=(12, 20),
                   day_turns=6, day_chats=3, day_restart_every=3, day_history=(150, 250, 200),
                   day_max_tokens=8, restore_tokens=1000, restore_reps=3,
                   long_n_ctx=512, long_turns=10, long_max_tokens=16,
                   users=(1, 2, 4), users_requests=1, users_max_tokens=48, batch_steps=24,
                   batch_rounds=2)

    @classmethod
    def shapes_plan(cls) -> "Plan":
        """Shortened run for the larger random-weight shapes: scenario 1 (and several users
        if asked), one run."""
        return cls(runs=1, sizes=(250, 1000, 2000), users=(1, 4), users_requests=1)


@dataclass
class Context:
    """Where a scenario runs: the model, a scratch folder, the plan."""

    model: Path
    work: Path
    plan: Plan
    systems: tuple[str, ...] = SYSTEMS
    _count: Callable[[str], int] | None = field(default=None, repr=False)

    def folder(self, *parts: str) -> Path:
        path = self.work.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def system(self, kind: str, folder: Path, *, max_tokens: int | None = None) -> System:
        return make_system(kind, folder, self.model, n_ctx=self.plan.n_ctx,
                           max_tokens=max_tokens or self.plan.max_tokens,
                           threads=self.plan.threads)

    def count(self, text: str) -> int:
        """Tokens of text with this model's tokenizer (vocabulary only, no weights)."""
        if self._count is None:
            from llama_cpp import Llama

            vocab = Llama(model_path=str(self.model), vocab_only=True, verbose=False)
            self._count = lambda t: len(vocab.tokenize(t.encode(), add_bos=False, special=True))
        return self._count(text)


# helpers


def clone(src: Path, dst: Path, *, with_kv: bool = True) -> Path:
    """Copy a system's folder; without_kv drops reame's KV files (for the no-cache twin)."""
    if dst.exists():
        shutil.rmtree(dst)
    ignore = None if with_kv else shutil.ignore_patterns("kv")
    shutil.copytree(src, dst, ignore=ignore)
    return dst


def source_folder(kind: str, bases: dict[str, Path]) -> tuple[Path, bool]:
    """Which base folder a system starts from, and whether to keep the KV files."""
    if kind == DISK_CACHE:
        return bases[DISK_CACHE], True
    return bases[REAME], kind == REAME


def of_kind(mapping: dict, kind: str):
    """The entry of a per-base mapping for kind (no cache shares reame's)."""
    return mapping[DISK_CACHE] if kind == DISK_CACHE else mapping[REAME]


def base_kinds(systems: tuple[str, ...]) -> list[str]:
    """The systems whose bases must be built (no cache reuses reame's database)."""
    return [REAME] + ([DISK_CACHE] if DISK_CACHE in systems else [])


def summary(results: list[TurnResult]) -> dict:
    """Medians (and spread) of a list of turns of one system."""
    ttft = [r.ttft_s for r in results]
    return {
        "turns": len(results),
        "ttft_s": statistics.median(ttft),
        "ttft_min_s": min(ttft), "ttft_max_s": max(ttft),
        "total_s": statistics.median(r.total_s for r in results),
        "sum_total_s": sum(r.total_s for r in results),
        "prompt_tokens": statistics.median(r.prompt_tokens for r in results),
        "reused": statistics.median(r.reused for r in results),
        "prefilled": statistics.median(r.prefilled for r in results),
        "evaluated": statistics.median(r.evaluated for r in results),
        "sum_evaluated": sum(r.evaluated for r in results),
        "bytes_written": statistics.median(r.bytes_written for r in results),
        "sum_bytes_written": sum(r.bytes_written for r in results),
        "peak_rss": max(r.peak_rss for r in results),
        "rss_growth": max(r.rss_growth for r in results),
        "restore_ms": statistics.median(r.restore_ms for r in results),
        "save_ms": statistics.median(r.save_ms for r in results),
        "prefill_ms": statistics.median(r.extra.get("prefill_ms", 0.0) for r in results),
        "sources": sorted({r.source for r in results}),
    }


def turn_dicts(results: list[TurnResult]) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "text"} for r in results]


def build_chat(system: System, pairs: list[tuple[str, str]], *, system_prompt: str | None = None,
               build: bool = True) -> int:
    """A chat with the pairs inserted and (if build) one real turn, whose KV gets saved."""
    chat = system.new_chat() if system_prompt is None else system.new_chat(system_prompt)
    system.insert(chat, pairs)
    if build:
        system.send(chat, BUILD_MESSAGE)
    return chat


# 1. restart and continue


def restart_and_continue(ctx: Context) -> dict:
    """Histories of several lengths; restart; one more message. Median of plan.runs."""
    plan, rows, turns, bases_by_size = ctx.plan, [], [], {}
    for size in plan.sizes:
        hist = workload.history(ctx.count, max(32, size - HISTORY_OVERHEAD))
        bases, chat_ids = {}, {}
        for kind in base_kinds(ctx.systems):
            log.info("scenario 1: %d tokens: building the history for %s", size, kind)
            with ctx.system(kind, ctx.folder("s1", str(size), "base", kind)) as system:
                chat_ids[kind] = build_chat(system, hist.pairs)
            bases[kind] = system.folder
        bases_by_size[size] = (bases[REAME], chat_ids[REAME])
        variants = list(ctx.systems) + (list(PAGE_VARIANTS) if REAME in ctx.systems else [])
        per_system: dict[str, list[TurnResult]] = {k: [] for k in variants}
        for run in range(plan.runs):
            for variant in variants:
                kind = REAME if variant in PAGE_VARIANTS else variant
                src, with_kv = source_folder(kind, bases)
                dst = clone(src, ctx.work / "s1" / str(size) / f"run{run}" / kind, with_kv=with_kv)
                with ctx.system(kind, dst) as system:  # the restart: a new process, same files
                    chat_id = of_kind(chat_ids, kind)
                    opened_s = system.open_chat(chat_id) if variant in PAGE_VARIANTS else 0.0
                    typed_s = (system.type_ahead(chat_id, NEXT_MESSAGE)
                               if variant == REAME_TYPED else 0.0)
                    result = system.send(chat_id, NEXT_MESSAGE)
                shutil.rmtree(dst)
                result.system = variant
                result.extra["open_chat_s"] = opened_s
                result.extra["type_ahead_s"] = typed_s
                log.info("scenario 1: %d tokens, run %d, %s: first token %.3f s, %d evaluated, "
                         "source %s", size, run + 1, variant, result.ttft_s, result.evaluated,
                         result.source)
                per_system[variant].append(result)
        for kind, results in per_system.items():
            rows.append({"size": size, "system": kind, **summary(results)})
            turns += [{"size": size, **t} for t in turn_dicts(results)]
    return {"rows": rows, "turns": turns, "runs": plan.runs, "sizes": list(plan.sizes),
            "_bases": bases_by_size}


# 2. switching between chats


def switching(ctx: Context) -> dict:
    """Several chats with long histories, answered in turn for several rounds, no restart."""
    plan = ctx.plan
    hists = [workload.history(ctx.count, plan.switch_tokens - HISTORY_OVERHEAD,
                              seed=workload.SEED + i) for i in range(plan.switch_chats)]
    bases, chat_ids = {}, {}
    for kind in base_kinds(ctx.systems):
        log.info("scenario 2: building %d chats for %s", plan.switch_chats, kind)
        with ctx.system(kind, ctx.folder("s2", "base", kind)) as system:
            chat_ids[kind] = [build_chat(system, h.pairs) for h in hists]
        bases[kind] = system.folder
    rng = random.Random(workload.SEED)
    results: dict[str, list[TurnResult]] = {k: [] for k in ctx.systems}
    with side_by_side(ctx, {k: source_folder(k, bases) for k in ctx.systems}, "s2") as systems:
        for r in range(plan.switch_rounds):
            for i in range(len(hists)):
                text = f"Round {r + 1}. {workload.paragraph(rng, 20)}"
                for kind, system in systems.items():
                    results[kind].append(system.send(of_kind(chat_ids, kind)[i], text))
                log.info("scenario 2: round %d chat %d: %s", r + 1, i + 1, _firsts(results))
    rows = [{"system": kind, **summary(res)} for kind, res in results.items()]
    turns = [{"round": n // len(hists) + 1, **t} for res in results.values()
             for n, t in enumerate(turn_dicts(res))]
    return {"rows": rows, "turns": turns, "chats": plan.switch_chats,
            "tokens": plan.switch_tokens, "rounds": plan.switch_rounds}


@contextlib.contextmanager
def side_by_side(ctx: Context, sources: dict[str, tuple[Path | None, bool]], name: str, *,
                 max_tokens: int | None = None):
    """The systems started together, each in its own folder (a copy of its source, or empty).

    They take each step in turn (interleaved), so that a change in the machine's load hits
    them alike; each keeps its own context, so they do not disturb one another's reuse."""
    systems = {}
    try:
        for kind, (src, with_kv) in sources.items():
            folder = ctx.work / name / "side" / kind
            if src is not None:
                clone(src, folder, with_kv=with_kv)
            systems[kind] = ctx.system(kind, folder, max_tokens=max_tokens).start()
        yield systems
    finally:
        for system in systems.values():
            system.close()


def _firsts(results: dict[str, list[TurnResult]]) -> str:
    return ", ".join(f"{k} {v[-1].ttft_s:.2f} s ({v[-1].source})" for k, v in results.items() if v)


# 3. shared prefix


def shared_prefix(ctx: Context) -> dict:
    """New chats with the same long system prompt: in one process, and each after a restart."""
    plan = ctx.plan
    prompt = workload.system_prompt(ctx.count, plan.prefix_tokens)
    rng = random.Random(workload.SEED + 3)
    questions = [workload.user_message(rng, 15) for _ in range(plan.prefix_chats)]
    rows, turns = [], []
    for variant in ("one process", "restart before each chat"):
        results: dict[str, list[TurnResult]] = {k: [] for k in ctx.systems}
        empty = {k: (None, False) for k in ctx.systems}
        with side_by_side(ctx, empty, "s3-" + variant.replace(" ", "-")) as systems:
            for i, question in enumerate(questions):
                for kind, system in systems.items():
                    if i and variant != "one process":
                        system.restart()
                    results[kind].append(system.send(system.new_chat(prompt), question))
                log.info("scenario 3: %s, chat %d: %s", variant, i + 1, _firsts(results))
        for kind, res in results.items():
            later = res[1:] or res
            rows.append({"variant": variant, "system": kind, "first_chat_ttft_s": res[0].ttft_s,
                         **summary(later), "all_evaluated": sum(r.evaluated for r in res),
                         "all_bytes_written": sum(r.bytes_written for r in res)})
            turns += [{"variant": variant, **t} for t in turn_dicts(res)]
    return {"rows": rows, "turns": turns, "chats": plan.prefix_chats,
            "prefix_tokens": ctx.count(prompt)}


# 4. low overlap


def low_overlap(ctx: Context) -> dict:
    """Unrelated single-turn prompts: what saving costs when nothing is reused."""
    plan = ctx.plan
    prompts = workload.unrelated_prompts(plan.low_overlap_prompts, plan.low_overlap_words)
    results: dict[str, list[TurnResult]] = {kind: [] for kind in ctx.systems}
    empty = {k: (None, False) for k in ctx.systems}
    with side_by_side(ctx, empty, "s4", max_tokens=plan.low_overlap_max_tokens) as systems:
        for i, text in enumerate(prompts):
            for kind, system in systems.items():
                results[kind].append(system.send(system.new_chat(), text))
            log.info("scenario 4: prompt %d: %s", i + 1, ", ".join(
                f"{k} {v[-1].total_s:.2f} s" for k, v in results.items()))
    base = statistics.mean(r.total_s for r in results[NO_CACHE]) if NO_CACHE in results else None
    rows = []
    for kind, res in results.items():
        mean_total = statistics.mean(r.total_s for r in res)
        rows.append({"system": kind, **summary(res), "mean_total_s": mean_total,
                     "overhead": (mean_total / base - 1) if base else None,
                     "save_share": statistics.median(_save_share(r) for r in res)})
    per_prompt = {kind: [r.total_s for r in res] for kind, res in results.items()}
    return {"rows": rows, "per_prompt": per_prompt, "prompts": len(prompts),
            "max_tokens": plan.low_overlap_max_tokens,
            "turns": [t for res in results.values() for t in turn_dicts(res)]}


def _save_share(r: TurnResult) -> float:
    return (r.save_ms / 1000) / r.total_s if r.total_s else 0.0


# 5. edit in the middle


def edit_middle(ctx: Context) -> dict:
    """A chat of plan.edit_turns turns; edit the 3rd user message and resend."""
    plan = ctx.plan
    rng = random.Random(workload.SEED + 5)
    low, high = plan.edit_pair_words
    pairs = [(workload.user_message(rng, low), workload.paragraph(rng, high))
             for _ in range(plan.edit_turns - 1)]
    edited = "Actually, let me ask it differently: how do libraries decide what to buy?"
    inserted, built, chat_ids = {}, {}, {}
    for kind in base_kinds(ctx.systems):
        with ctx.system(kind, ctx.folder("s5", "inserted", kind)) as system:
            chat_ids[kind] = build_chat(system, pairs, build=False)
        inserted[kind] = system.folder
        built[kind] = clone(inserted[kind], ctx.work / "s5" / "built" / kind)
        with ctx.system(kind, built[kind]) as system:
            system.send(chat_ids[kind], BUILD_MESSAGE)
    rows, turns = [], []
    for variant in ("same process", "after a restart"):
        per_system: dict[str, list[TurnResult]] = {k: [] for k in ctx.systems}
        for run in range(plan.runs):
            for kind in ctx.systems:
                bases = inserted if variant == "same process" else built
                src, with_kv = source_folder(kind, bases)
                dst = clone(src, ctx.work / "s5" / f"run{run}" / kind, with_kv=with_kv)
                chat = of_kind(chat_ids, kind)
                with ctx.system(kind, dst) as system:
                    if variant == "same process":
                        system.send(chat, BUILD_MESSAGE)  # the 6th turn, live in this process
                    per_system[kind].append(system.edit(chat, 2, edited))
                shutil.rmtree(dst)
                r = per_system[kind][-1]
                log.info("scenario 5: %s, run %d, %s: first token %.3f s, %d reused, %d evaluated",
                         variant, run + 1, kind, r.ttft_s, r.reused, r.evaluated)
        for kind, res in per_system.items():
            rows.append({"variant": variant, "system": kind, **summary(res)})
            turns += [{"variant": variant, **t} for t in turn_dicts(res)]
    return {"rows": rows, "turns": turns, "turns_in_chat": plan.edit_turns}


# 6. over time


def over_time(ctx: Context) -> dict:
    """A scripted day: turns across chats, a restart every few turns; cumulative seconds."""
    plan = ctx.plan
    ctx = replace(ctx, systems=tuple(k for k in ctx.systems if k in plan.day_systems))
    steps = workload.day_script(plan.day_turns, plan.day_chats, plan.day_restart_every)
    hists = [workload.history(ctx.count, max(32, size - HISTORY_OVERHEAD),
                              seed=workload.SEED + 60 + i)
             for i, size in enumerate(plan.day_history[: plan.day_chats])]
    bases, chat_ids = {}, {}
    for kind in base_kinds(ctx.systems):
        log.info("scenario 6: the day before: %d chats for %s", plan.day_chats, kind)
        with ctx.system(kind, ctx.folder("s6", "base", kind),
                        max_tokens=plan.day_max_tokens) as system:
            chat_ids[kind] = [build_chat(system, h.pairs) for h in hists]
        bases[kind] = system.folder
    results: dict[str, list[TurnResult]] = {k: [] for k in ctx.systems}
    restarts = 0
    with side_by_side(ctx, {k: source_folder(k, bases) for k in ctx.systems}, "s6",
                      max_tokens=plan.day_max_tokens) as systems:
        for n, step in enumerate(steps):
            for kind, system in systems.items():
                if step.restart_before:
                    system.restart()
                results[kind].append(system.send(of_kind(chat_ids, kind)[step.chat], step.text))
            restarts += step.restart_before
            log.info("scenario 6: turn %d/%d (chat %d%s): %s", n + 1, len(steps), step.chat + 1,
                     ", after a restart" if step.restart_before else "", _firsts(results))
    curves, rows, turns = {}, [], []
    for kind, res in results.items():
        cumulative, total = [], 0.0
        for r in res:
            total += r.total_s
            cumulative.append(total)
        curves[kind] = cumulative
        log.info("scenario 6: %s: %.1f s over %d turns", kind, total, len(res))
        rows.append({"system": kind, **summary(res), "restarts": restarts,
                     "save_share": statistics.median(_save_share(r) for r in res)})
        turns += [{"step": n, "chat": steps[n].chat, "restart_before": steps[n].restart_before,
                   **t} for n, t in enumerate(turn_dicts(res))]
    return {"rows": rows, "curves": curves, "turns": turns,
            "restart_at": [n for n, s in enumerate(steps) if s.restart_before],
            "day_turns": plan.day_turns, "day_chats": plan.day_chats,
            "max_tokens": plan.day_max_tokens,
            "restart_every": plan.day_restart_every}


# 7. long chat


LONG_SHIFT, LONG_REEVALUATE = "shift", "re-evaluate"


def long_chat(ctx: Context) -> dict:
    """One chat of plan.long_turns turns at n_ctx plan.long_n_ctx: whenever the next turn would
    not fit, the oldest messages leave the chat's window (ChatService._fit). reame (cache on)
    twice, side by side: its KV shifted at each overflow (the default), and the kept window
    re-evaluated (the engine told it cannot shift)."""
    plan = ctx.plan
    texts = workload.long_chat_messages(plan.long_turns, plan.long_words)
    variants = {LONG_SHIFT: True, LONG_REEVALUATE: False}
    results: dict[str, list[TurnResult]] = {v: [] for v in variants}
    replies: dict[str, list[str]] = {v: [] for v in variants}
    systems: dict[str, ServiceSystem] = {}
    can_shift = {}
    try:
        for variant, shift in variants.items():
            folder = ctx.work / "s7" / variant
            if folder.exists():
                shutil.rmtree(folder)
            systems[variant] = ServiceSystem(
                folder, ctx.model, cache=True, n_ctx=plan.long_n_ctx,
                max_tokens=plan.long_max_tokens, threads=plan.threads, shift=shift).start()
            can_shift[variant] = systems[variant].engine.can_shift
        chats = {v: s.new_chat() for v, s in systems.items()}
        for n, text in enumerate(texts):
            for variant, system in systems.items():
                result = system.send(chats[variant], text)
                result.system = variant
                results[variant].append(result)
                replies[variant].append(result.text)
            log.info("scenario 7: turn %d/%d: %s", n + 1, len(texts), ", ".join(
                f"{v} {r[-1].ttft_s:.2f} s ({r[-1].prompt_tokens} prompt tokens"
                f"{', overflow' if _overflow(r[-1]) else ''})" for v, r in results.items()))
    finally:
        for system in systems.values():
            system.close()
    rows, turns = [], []
    for variant, res in results.items():
        over = [r for r in res if _overflow(r)]
        rest = [r for r in res if not _overflow(r)]
        rows.append({
            "variant": variant, "turns": len(res),
            "sum_total_s": sum(r.total_s for r in res),
            "mean_total_s": statistics.mean(r.total_s for r in res),
            "median_total_s": statistics.median(r.total_s for r in res),
            "overflows": len(over),
            "shifted": sum(1 for r in over if r.extra["shifted"]),
            "recomputed": sum(1 for r in over if r.extra["window_recomputed"]),
            "overflow_ttft_s": _median(r.ttft_s for r in over),
            "overflow_evaluated": _median(r.evaluated for r in over),
            "other_ttft_s": _median(r.ttft_s for r in rest),
            "other_evaluated": _median(r.evaluated for r in rest),
            "max_prompt_tokens": max(r.prompt_tokens for r in res),
            "replies": sum(1 for t in replies[variant] if t.strip()),
            "peak_rss": max(r.peak_rss for r in res),
            "rss_growth": max(r.rss_growth for r in res),
        })
        turns += [{"turn": n + 1, "overflow": _overflow(r), **t}
                  for n, (r, t) in enumerate(zip(res, turn_dicts(res)))]
    sizes = [ctx.count(t) for t in texts]
    a, b = replies[LONG_SHIFT], replies[LONG_REEVALUATE]
    differ = [n + 1 for n, (x, y) in enumerate(zip(a, b)) if x != y]
    return {"rows": rows, "turns": turns, "n_ctx": plan.long_n_ctx, "chat_turns": len(texts),
            "max_tokens": plan.long_max_tokens, "can_shift": can_shift,
            "message_tokens": [min(sizes), max(sizes)],
            "same_replies": len(a) - len(differ), "first_different_reply": differ[0] if differ
            else None}


def _overflow(r: TurnResult) -> bool:
    """Messages left the chat's window in this turn (shifted or re-evaluated)."""
    return bool(r.extra.get("shifted") or r.extra.get("window_recomputed"))


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


# extras: KV size per token, restore throughput, save share


def kv_bytes_per_token(ctx: Context) -> dict:
    """State bytes per token at f16 and q8_0: the slope between two prefill lengths."""
    from reame.inference.engine import Engine

    n1, n2 = ctx.plan.kv_probe_tokens
    tokens = _filler_tokens(ctx, n2)
    rows = []
    for kv_type in ("f16", "q8_0"):
        engine = Engine(ctx.model, n_ctx=max(512, n2 + 64), kv_type=kv_type,
                        n_threads=ctx.plan.threads)
        try:
            engine.extend(tokens[:n1])
            size1 = len(engine.state())
            engine.extend(tokens[n1:n2])
            size2 = len(engine.state())
        finally:
            engine.close()
        per_token = (size2 - size1) / (n2 - n1)
        rows.append({"kv_type": kv_type, "bytes_per_token": per_token,
                     "fixed_bytes": size2 - per_token * n2,
                     "mb_per_1000_tokens": per_token * 1000 / MB})
    return {"rows": rows, "probe_tokens": [n1, n2]}


def _filler_tokens(ctx: Context, n: int) -> list[int]:
    from llama_cpp import Llama

    vocab = Llama(model_path=str(ctx.model), vocab_only=True, verbose=False)
    text = workload.paragraph(random.Random(workload.SEED + 7), n * 2)
    return vocab.tokenize(text.encode(), add_bos=False, special=True)[:n]


def restore_throughput(ctx: Context, base: Path, chat_id: int) -> dict:
    """Read + restore a reame KV file vs a plain sequential read of the same file, step by step,
    in a fresh process (see restore_profile.py); and the prefill of a new message after it."""
    from . import restore_profile

    plan = ctx.plan
    system = ServiceSystem(base, ctx.model, cache=True, n_ctx=plan.n_ctx,
                           max_tokens=plan.max_tokens, threads=plan.threads).start()
    try:
        path = system.kv.folder / system.kv.chat_key(chat_id)
        new = system.engine.tokenize(
            f"<|im_start|>user\n{NEXT_MESSAGE}<|im_end|>\n<|im_start|>assistant\n")
        decode = restore_profile.first_decode(system.engine, system.kv, path, new)
        out = restore_profile.profile(system.engine, system.kv, path, plan.restore_reps)
    finally:
        system.close()
    out["decode_ms"] = decode
    out["new_tokens"] = len(new)
    return out


def save_share(scenarios: dict) -> dict:
    """Save time per turn as a share of the turn, for reame, from the turns already run."""
    rows = []
    for name, key in (("1. restart and continue", "s1"), ("2. switching", "s2"),
                      ("4. low overlap", "s4"), ("6. over time", "s6")):
        turns = [t for t in scenarios.get(key, {}).get("turns", []) if t["system"] == REAME]
        if not turns:
            continue
        shares = [t["save_ms"] / 1000 / t["total_s"] for t in turns if t["total_s"]]
        writes = [t["extra"].get("write_ms", 0.0) for t in turns]
        rates = [t["bytes_written"] / MB / (w / 1000) for t, w in zip(turns, writes) if w]
        rows.append({"scenario": name, "turns": len(turns),
                     "save_ms": statistics.median(t["save_ms"] for t in turns),
                     "write_ms": statistics.median(writes),
                     "share": statistics.median(shares), "max_share": max(shares),
                     "mb_per_s": statistics.median(rates) if rates else 0.0})
    return {"rows": rows}
