"""Scenario "several users": 1, 2, 4, 8 clients at once, each in its own chat, over HTTP.

Every system is a real server process (bench/servers.py), started side by side and measured
round by round (one user count, every system in turn), so that a change in the machine's load
hits them alike. Each client keeps its own history of about 1,000 tokens (filler from a fixed
seed, different per client) and sends short questions on it through the `openai` SDK
(/v1/chat/completions, stream=True, temperature 0), one after another, replies of at most
plan.users_max_tokens tokens. Client i starts i * plan.users_stagger_s seconds into the round,
so that short messages arrive while the others' replies stream.

Before the rounds every client's history is sent once (a reply of one token): a returning
user's chat, whose KV reame keeps on disk. Measured per request: the time to the first streamed
content token, the tokens received (the usage chunk, else one per content chunk) and the end.
Aggregate tokens/s = all tokens of the round / the round's wall time.
"""

from __future__ import annotations

import contextlib
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import servers, workload
from .scenarios import Context
from .servers import LLAMA_SERVER, Server
from .systems import SYSTEM_PROMPT

log = logging.getLogger(__name__)

WARM_QUESTION = "Let us continue where we left off."
REQUEST_TIMEOUT_S = 900
PAUSE_S = 1.0  # between rounds: reame's background KV writes land


@dataclass(frozen=True)
class Client:
    """One user: a chat history of its own and the questions it will ask on it."""

    index: int
    history: list[dict]  # the system message, then user/assistant turns
    tokens: int  # estimated tokens of the history, template included
    questions: list[str]

    def messages(self, question: str) -> list[dict]:
        return [*self.history, {"role": "user", "content": question}]


def make_client(count: Callable[[str], int], index: int, history_tokens: int,
                n_questions: int) -> Client:
    system_tokens = count(SYSTEM_PROMPT) + workload.TEMPLATE_TOKENS
    hist = workload.history(count, history_tokens - system_tokens,
                            seed=workload.SEED + 1000 + index)
    turns = [{"role": "system", "content": SYSTEM_PROMPT}]
    for user, reply in hist.pairs:
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    rng = random.Random(f"{workload.SEED}-user-{index}")
    questions = [f"{workload.user_message(rng, 6)} Please explain in detail."
                 for _ in range(n_questions)]
    return Client(index, turns, hist.tokens + system_tokens, questions)


def several_users(ctx: Context) -> dict:
    """The scenario on ctx.model with ctx.plan's counts and systems (see the module doc)."""
    plan = ctx.plan
    most = max(plan.users)
    clients = [make_client(ctx.count, i, plan.users_history, plan.users_requests)
               for i in range(most)]
    out = {"counts": list(plan.users), "requests_per_client": plan.users_requests,
           "max_tokens": plan.users_max_tokens, "n_ctx": plan.users_n_ctx,
           "stagger_s": plan.users_stagger_s, "slots": most,
           "slots_known": servers.reame_knows_slots(),
           "history_tokens": round(statistics.mean(c.tokens for c in clients)),
           "systems": {}, "rows": [], "requests": [], "warm": []}
    with contextlib.ExitStack() as stack:
        running = _start_all(ctx, stack, out["systems"], slots=most)
        for kind, server in running.items():
            out["warm"] += warm(kind, server, clients)
        for n in plan.users:
            for kind, server in running.items():
                time.sleep(PAUSE_S)
                requests, wall = run_round(server, clients[:n], plan)
                out["requests"] += [{"system": kind, "users": n, **r} for r in requests]
                row = summarise(kind, n, requests, wall)
                out["rows"].append(row)
                log.info("users: %d, %s: first token p50 %.2f s, p95 %.2f s; %.1f tok/s", n,
                         kind, row["p50_s"] or 0, row["p95_s"] or 0, row["tok_s"])
    for row in out["rows"]:
        alone = next((r for r in out["rows"] if r["system"] == row["system"]
                      and r["users"] == 1), None)
        row["vs_one"] = row["tok_s"] / alone["tok_s"] if alone and alone["tok_s"] else None
    return out


def warm(kind: str, server: Server, clients: list[Client]) -> list[dict]:
    """Every client's chat sent once (a reply of one token), so that reame has its KV on disk.
    llama-cpp-python's server keeps no cache: one short request absorbs its first-call costs,
    and sending every history would only leave the last one in its context."""
    if kind == LLAMA_SERVER:
        chats = [("hello", [{"role": "user", "content": "Hello."}])]
    else:
        chats = [(c.index, c.messages(WARM_QUESTION)) for c in clients]
    log.info("users: %s: warming %d chat(s)", kind, len(chats))
    return [{"system": kind, "client": index, **ask(server, messages, 1, time.perf_counter())}
            for index, messages in chats]


def _start_all(ctx: Context, stack: contextlib.ExitStack, status: dict, *, slots: int) -> dict:
    """Start plan.users_systems (each ended when stack closes); status says what ran."""
    plan, running = ctx.plan, {}
    for kind in plan.users_systems:
        missing = servers.llama_server_missing() if kind == LLAMA_SERVER else None
        if missing:
            status[kind] = missing
            continue
        folder = ctx.folder("users", kind.replace(" ", "-"))
        try:
            running[kind] = stack.enter_context(servers.start(
                kind, folder, ctx.model, n_ctx=plan.users_n_ctx, slots=slots,
                threads=plan.threads, max_tokens=plan.users_max_tokens))
        except RuntimeError as exc:
            log.error("users: %s did not start: %s", kind, exc)
            status[kind] = f"did not start ({exc})"
            continue
        status[kind] = "measured"
    return running


def run_round(server: Server, clients: list[Client], plan) -> tuple[list[dict], float]:
    """Every client asks its questions one after another, client i from i * stagger s on;
    the requests (times from the round's start) and the round's wall time."""
    results: list[dict] = []
    started = time.perf_counter()

    def one_user(client: Client) -> None:
        time.sleep(client.index * plan.users_stagger_s)
        for k, question in enumerate(client.questions[:plan.users_requests]):
            results.append({"client": client.index, "request": k,
                            **ask(server, client.messages(question), plan.users_max_tokens,
                                  started)})

    threads = [threading.Thread(target=one_user, args=(c,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - started


@dataclass
class Streamed:
    """What one streamed completion gave: when it was sent, its first content and its end
    (perf_counter), the content pieces, the usage, and the last chunk's extra fields."""

    sent: float
    first: float | None = None
    end: float = 0.0
    pieces: list[str] = field(default_factory=list)
    usage: object | None = None
    extra: dict = field(default_factory=dict)


def stream_completion(url: str, model_id: str, messages: list[dict],
                      max_tokens: int) -> Streamed:
    """One greedy completion streamed through the openai SDK from the /v1 at url; raises what
    the request raises (streamed.sent is set before)."""
    from openai import OpenAI

    api = OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    streamed = Streamed(sent=time.perf_counter())
    try:
        stream = api.chat.completions.create(
            model=model_id, messages=messages, stream=True, temperature=0, top_p=1,
            seed=0, max_tokens=max_tokens, stream_options={"include_usage": True})
        for chunk in stream:
            streamed.usage = chunk.usage or streamed.usage
            # a field's last value that is not empty (reame's counts, llama-server's timings)
            streamed.extra.update((k, v) for k, v in (chunk.model_extra or {}).items() if v)
            if chunk.choices and chunk.choices[0].delta.content:
                streamed.first = streamed.first or time.perf_counter()
                streamed.pieces.append(chunk.choices[0].delta.content)
    finally:
        api.close()
        streamed.end = time.perf_counter()
    return streamed


def ask(server: Server, messages: list[dict], max_tokens: int, t0: float) -> dict:
    """One streamed completion, timed from t0; an error is recorded, not raised."""
    sent = time.perf_counter()
    try:
        streamed = stream_completion(server.url, server.model_id, messages, max_tokens)
    except Exception as exc:  # a failed request is a result, not the end of the run
        log.error("users: %s: request failed: %s", server.kind, exc)
        return {"sent_s": sent - t0, "end_s": time.perf_counter() - t0, "error": str(exc)}
    usage, extra, end = streamed.usage, streamed.extra.get("reame") or {}, streamed.end
    first = streamed.first or end
    return {"sent_s": streamed.sent - t0, "first_s": first - t0, "end_s": end - t0,
            "ttft_s": first - streamed.sent,
            "tokens": usage.completion_tokens if usage else len(streamed.pieces),
            "tokens_from": "usage" if usage else "chunks",
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "reused": extra.get("reused"), "source": extra.get("source")}


def summarise(kind: str, n: int, requests: list[dict], wall: float) -> dict:
    """One row: percentiles of the first token, aggregate tokens/s, what overlapped."""
    ok = [r for r in requests if "error" not in r]
    ttft = [r["ttft_s"] for r in ok]
    tokens = sum(r["tokens"] for r in ok)
    reused = [r["reused"] for r in ok if r.get("reused") is not None]
    prompts = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens")]
    # each reply's own pace once it streams: (tokens - 1) over first token to end
    paces = [(r["tokens"] - 1) / (r["end_s"] - r["first_s"]) for r in ok
             if r["tokens"] > 1 and r["end_s"] > r["first_s"]]
    return {"system": kind, "users": n, "requests": len(requests),
            "errors": len(requests) - len(ok), "overlapped": sum(_overlapped(r, ok) for r in ok),
            "p50_s": percentile(ttft, 50), "p95_s": percentile(ttft, 95),
            "max_s": max(ttft, default=None), "tokens": tokens, "wall_s": wall,
            "tok_s": tokens / wall if wall else 0.0,
            "mean_tokens": tokens / len(ok) if ok else 0.0,
            "reply_tok_s": statistics.median(paces) if paces else None,
            "prompt_tokens": statistics.median(prompts) if prompts else None,
            "reused": statistics.median(reused) if reused else None}


def _overlapped(request: dict, others: list[dict]) -> bool:
    """Whether another reply was streaming when this request was sent."""
    return any(o is not request and o["first_s"] <= request["sent_s"] < o["end_s"]
               for o in others)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)
