"""One turn of the model: restore -> evaluate the new tokens -> sample -> keep.

Every turn goes through TurnRunner: a stored chat's message, regenerate and edit, a stateless
/v1 request (all `run`), and type-ahead (`prefill` alone). They differ only in their Job (the
prompt and how to sample it) and their Keeper (what is kept afterwards: a stored chat's message
and KV file, or a stateless conversation's KV file and reply tokens). Each step happens once,
here, and is timed once. Maintenance work runs the engine on the scheduler's thread without
it, answering nobody: the warm-up at start (warmup.py), the shared default prompt's snapshot
(ChatService.share_default_prompt) and a chat's KV restored when it is opened
(ChatService.restore_ahead).

`run` and `prefill_steps` are generators of steps (scheduler.py): they yield None between two
decodes, so that other people's replies take their turns there, and run on the engine's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Protocol

from reame.config.refusals import ChatNotFound
from reame.inference.cache import KVCache
from reame.inference.cache_state import Drop, Restored
from reame.inference.decoding import Decoding
from reame.inference.engine import Engine
from reame.inference.prompt import PromptBuilder, PromptMessage
from reame.inference.sampling import Sampling
from reame.inference.scope import Scope
from reame.inference.tools import Tool

log = logging.getLogger(__name__)


@dataclass
class TurnStats:
    """What a turn did, in numbers (render.stats_text words them for people)."""

    reused: int = 0  # history tokens whose KV was reused
    source: str = "none"  # where they came from: live / disk / branch / prefix / none
    restore_ms: float = 0.0  # reading and loading a KV file
    prompt_tokens: int = 0
    prefilled: int = 0  # tokens evaluated for the prompt
    prefill_ms: float = 0.0
    save_ms: float = 0.0  # copying the KV out for its file, after the reply
    first_token_s: float = 0.0
    generated: int = 0
    tokens_per_s: float = 0.0
    total_s: float = 0.0
    ahead: int = 0  # tokens of the next prompt's fixed head, evaluated after the reply
    first_logits: str = ""  # xxh3-64 of the logits the first token was sampled from
    typed_ahead: int = 0  # tokens of this message evaluated while it was being typed
    dropped_messages: int = 0  # oldest messages outside the model's window (context)
    shifted: int = 0  # tokens this turn dropped from the KV by a context shift
    window_recomputed: bool = False  # messages left the window and the KV could not follow
    stopped: bool = False
    at_limit: bool = False  # ended by max_tokens (or a full context), not by the model
    # From the message's arrival (the page's send, an API call) to the first token: what the
    # person waited, the wait for a slot, storing the message and building the prompt
    # included (first_token_s counts from the turn's start on its slot). 0: not known.
    waited_s: float = 0.0
    # This machine's prefill speed (tokens/s) when the turn ran, 0 if not measured yet: what
    # evaluating the reused tokens again would have taken (the stats line says it).
    prefill_rate: float = 0.0
    # Tokens the KV held that were evaluated again: a memory that cannot be cut back went
    # back to its last checkpoint before where the prompt left it (an edit, a regenerate).
    read_again: int = 0
    # A Continue: the length of the reply's text it went on from (its words are not this
    # turn's).
    continued_chars: int = 0
    # Messages before this turn's in the conversation (those outside the window included):
    # 0 for a chat's first message, whose reused tokens can only be its opening (the system
    # prompt, shared with other chats). -1: not known (stats stored before it was counted).
    earlier_messages: int = -1

    @classmethod
    def from_dict(cls, values: dict) -> "TurnStats":
        """Stats as stored with a message (unknown keys, from older versions, ignored)."""
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


@dataclass
class TurnUpdate:
    """What a turn streams: the reply so far; the last update is done and carries the stats."""

    text: str
    done: bool = False
    stats: TurnStats | None = None
    message_id: int | None = None
    user_message_id: int | None = None
    finish_reason: str | None = None  # on the last update: "stop" or "length"
    # On the last update: the stop string the reply ended at (the request's or the chat
    # template's end), None when it ended otherwise.
    stop_sequence: str | None = None
    # The prompt's tokens, and those whose KV was reused, once known (from the first token
    # on; 0 while the turn waits in line): what an API says at a stream's start.
    prompt_tokens: int = 0
    reused: int = 0
    chat_id: int | None = None
    queued: int = 0  # waiting for a free slot: its place in line (1: next), no text yet
    # While a long prompt is read (a stored chat's turn): its tokens evaluated or reused so far
    # and in all, and the seconds left at this turn's own pace so far (0: not known yet).
    reading: tuple[int, int] | None = None
    reading_left_s: float = 0.0
    # On a stored chat's last update: its messages (a MessageTree) as the turn left them
    # (turns.py), for its caller to show without reading them back.
    kept: object | None = None
    # When the sampling asked for log-probabilities: a TokenChoice per token of the reply so
    # far (sampling.py).
    logprobs: tuple | None = None


@dataclass
class Job:
    """What one turn evaluates and how it samples."""

    prompt: list[int]
    turns: list[PromptMessage]  # the conversation the prompt holds (for the next turn's fixed head)
    system_prompt: str
    scope: Scope  # whose KV may be reused (scope.py)
    sampling: Sampling
    max_tokens: int
    stops: tuple[str, ...] = ()
    chat_id: int | None = None  # a stored chat (its own KV file); None: found by its tokens
    user_message_id: int | None = None  # the message this turn answers, when stored
    drop: Drop | None = None  # messages that left the chat's window in this turn
    outside: int = 0  # messages before the window
    shared_opening: bool = False  # the system prompt is the server's default (scope.SHARED)
    branched_from: int | None = None  # the chat this one was branched from (its KV file)
    tools: tuple[Tool, ...] = ()  # the functions the prompt offers (tools.py)
    # Where a reply's text so far ends early besides the stop strings (None: it goes on),
    # e.g. tools.repeated_call.
    ends: Callable[[str], int | None] | None = None
    # Raw text (/v1/completions): the prompt is the client's own text, no chat template. Its
    # reply is neither trimmed nor held to the template's stops, and no system prompt's
    # opening snapshot or next turn's head is made for it.
    plain: bool = False
    # When the message arrived (time.perf_counter()), for TurnStats.waited_s; None: unknown.
    arrived: float | None = None
    # The person's own wait from sending to the first words, once their browser says it (the
    # page's report, page.js): TurnStats.waited_s is at least that. None: not (yet) said.
    seen: Callable[[], float | None] | None = None


class Keeper(Protocol):
    """What a turn keeps once its reply ends, however it ends."""

    def alive(self) -> bool:
        """Whether there is still something to keep (a stored chat may have been deleted)."""

    def keep(self, decoding: "Decoding", stats: TurnStats) -> int | None:
        """Keep the reply; the stored message's id, if any."""


# A prompt with at least this many tokens to evaluate says how far its reading is (a few
# seconds on 2 cores): a shorter one is read before anyone would look.
READING_SHOWN_FROM = 512

# Told of every turn once it ends, however it ends (metrics): its stats, its decoding (the
# tokens' times; None if it was stopped before its reply began), and whether it was a stored
# chat's.
TurnObserver = Callable[["TurnStats", "Decoding | None", bool], None]


class TurnRunner:
    """Runs jobs on one engine, its KV cache and its prompt builder."""

    def __init__(self, engine: Engine, cache: KVCache, prompts: PromptBuilder,
                 observe: TurnObserver | None = None,
                 others: Callable[[], bool] | None = None):
        """others: whether turns besides the one ending are on a slot or waiting for one
        (None: never)."""
        self.engine, self.cache, self.prompts = engine, cache, prompts
        self.observe = observe
        self.others = others

    def run(self, job: Job, keeper: Keeper) -> Iterator[TurnUpdate]:
        """Prefill, stream the reply, keep it. The reply is kept also when the caller stops
        the stream (closing the generator)."""
        started = time.perf_counter()
        stats = TurnStats(prompt_tokens=len(job.prompt), dropped_messages=job.outside,
                          earlier_messages=job.outside + sum(
                              t.role in ("user", "assistant") for t in job.turns[:-1]))
        try:
            yield from self.prefill_steps(job, stats, progress=job.chat_id is not None)
        except GeneratorExit:  # stopped mid-prompt: what was evaluated stays live, and counts
            stats.stopped = True
            stats.total_s = time.perf_counter() - started
            log.info("chat %s: stopped mid-prompt, %s", job.chat_id or "-", _log_line(stats))
            self._tell(stats, None, job.chat_id is not None)
            raise
        limit = min(job.max_tokens, self.engine.n_ctx - len(job.prompt))
        stops = job.stops if job.plain else self.prompts.stops + job.stops
        decoding = Decoding(self.engine, job.sampling, limit, stops, started, job.ends)
        kept, message_id = False, None
        try:
            for text in decoding:
                yield None if text is None else TurnUpdate(
                    text, user_message_id=job.user_message_id, chat_id=job.chat_id,
                    logprobs=decoding.logprobs, prompt_tokens=stats.prompt_tokens,
                    reused=stats.reused)
        finally:
            decoding.record(stats)
            if job.arrived is not None and decoding.first_at:
                stats.waited_s = decoding.first_at - job.arrived
            seen = job.seen() if job.seen is not None and decoding.first_at else None
            if seen:
                stats.waited_s = max(stats.waited_s, seen)
            if keeper.alive():
                if decoding.complete and not job.plain and self._head_costs_nobody(job):
                    stats.ahead = self._prefill_next_head(job, decoding.generated)
                stats.total_s = time.perf_counter() - started
                stats.save_ms = self.cache.save(job.chat_id)
                message_id, kept = keeper.keep(decoding, stats), True
                log.info("chat %s: %s", job.chat_id or "-", _log_line(stats))
            self._tell(stats, decoding, job.chat_id is not None)
        if not kept:  # the chat was deleted while it answered
            raise ChatNotFound(job.chat_id)
        text = decoding.text if job.plain else decoding.text.strip()
        yield TurnUpdate(text, done=True, stats=stats, message_id=message_id,
                         user_message_id=job.user_message_id, chat_id=job.chat_id,
                         finish_reason=decoding.finish_reason, logprobs=decoding.logprobs,
                         stop_sequence=decoding.stop_sequence if decoding.cut else None,
                         prompt_tokens=stats.prompt_tokens, reused=stats.reused)

    def _tell(self, stats: TurnStats, decoding: Decoding | None, stored: bool) -> None:
        if self.observe is None:
            return
        try:
            self.observe(stats, decoding, stored)
        except Exception:  # counting must never break a turn
            log.exception("the turn observer failed")

    def prefill_steps(self, job: Job, stats: TurnStats, *, progress: bool = False
                      ) -> Generator[TurnUpdate | None, None, Restored]:
        """Restore what the cache has for the prompt, snapshot its opening if that is new,
        evaluate the rest; the restore as the cache reported it. A step after the restore and
        between two decodes; none after the last decode (its logits are to be sampled).
        progress: between the decodes of a long prompt, a TurnUpdate that says how far the
        reading is (the page shows it), rather than None."""
        engine, cache, prompt = self.engine, self.cache, job.prompt
        restored = cache.prepare(job.chat_id, prompt, job.drop, scope=job.scope,
                                 parent=job.branched_from)
        stats.reused, stats.source, stats.restore_ms = (
            restored.reused, restored.source, restored.restore_ms)
        # A memory that cannot be cut back (a recurrent state, a window slid past) resumes at a
        # checkpoint: what the KV held beyond it (after an edit, up to the change) is read again.
        shared = min(restored.shared or engine.common_prefix(prompt), len(prompt) - 1)
        if shared > restored.reused and not engine.cuttable(shared):
            stats.read_again = shared - restored.reused
        stats.prefill_rate = round(cache.prefill_rate, 1)
        if job.drop is not None:
            stats.shifted = restored.shifted
            stats.window_recomputed = restored.recomputed
        if not engine.ready_for(prompt):
            yield  # the restore was this step (typed ahead: its logits are to be sampled)
        seq = engine.seq
        started, busy, before = time.perf_counter(), seq.decode_s, seq.evaluated
        try:
            yield from self._snapshot_opening(job, restored)
            steps = engine.prefill_steps(prompt)
            if progress and len(prompt) - restored.reused >= READING_SHOWN_FROM:
                steps = self._reading(steps, job, seq, before, restored.reused, started)
            if (yield from steps) == len(prompt):  # typed ahead: live
                stats.reused = len(prompt)
            stats.typed_ahead = restored.typed_ahead(stats.reused)
        finally:  # also when stopped mid-prompt: what it evaluated
            stats.prefilled = seq.evaluated - before
            stats.prefill_ms = (time.perf_counter() - started) * 1000  # others' steps too
            cache.record_prefill(stats.prefilled, seq.decode_s - busy)  # its own decodes
        return restored

    @staticmethod
    def _reading(steps: Generator[None, None, int], job: Job, seq, before: int, reused: int,
                 started: float) -> Generator[TurnUpdate, None, int]:
        """steps, each step between two decodes a TurnUpdate of how far the prompt is read."""
        total = len(job.prompt)
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value
            evaluated = seq.evaluated - before
            pace = evaluated / max(time.perf_counter() - started, 1e-6)  # others' steps too
            left = (total - reused - evaluated) / pace if evaluated else 0.0
            yield TurnUpdate("", chat_id=job.chat_id, user_message_id=job.user_message_id,
                             prompt_tokens=total, reused=reused,
                             reading=(min(total, reused + evaluated), total),
                             reading_left_s=round(max(left, 0.0), 1))

    def _snapshot_opening(self, job: Job, restored: Restored) -> Iterator[None]:
        """Save the KV of the prompt's opening (its system prompt, whole chunks) as a prefix
        snapshot, if it is not on disk yet: another conversation with the same opening starts
        from it."""
        if not self.cache.enabled or job.plain:  # files keep it; raw text has no system prompt
            return
        opening = self.prompts.fixed_head(job.system_prompt, [], job.scope, job.tools)
        length = self.cache.prefix_length(opening, job.prompt)
        if restored.reused < length and self.cache.wants_snapshot(
                length, job.prompt, shared=job.shared_opening):
            # Whole chunks: the plan is unchanged.
            yield from self.engine.prefill_head_steps(job.prompt[:length])
            self.cache.save_snapshot(job.prompt, length, shared=job.shared_opening)
            yield

    def _head_costs_nobody(self, job: Job) -> bool:
        """Whether to evaluate the next turn's head now: always for a stored chat's turn (its
        person reads before writing) and with exact_under_load (a reply's KV then never
        depends on who else is talking); for a stateless request, only when no other turn is
        on a slot or waiting. Under load each such head was a decode of its own (0.2 s on the
        Qwen2.5-1.5B shape) that delayed this answer and everyone else's next step: 4 prompts
        sent at once, one such decode each."""
        if job.chat_id is not None or not self.engine.together or self.others is None:
            return True
        return not self.others()

    def _prefill_next_head(self, job: Job, generated: list[int]) -> int:
        """Evaluate now what the next prompt will hold whatever the user writes (e.g.
        "<|im_end|>\\n<|im_start|>user\\n"), so the next turn's first token waits only for the
        message itself. The next turn checks these tokens like any others (common prefix).

        Its decode moves work from the next turn's first token (measured on the Qwen2.5-1.5B
        shape: without it, a resent conversation's turn evaluated 40 tokens instead of 34,
        often one more 16-token decode, 0.3 s) to the end of this reply, where the person
        reads. See _head_costs_nobody for when it is not done."""
        engine = self.engine
        done = job.turns + [PromptMessage("assistant", "", tuple(generated))]
        head = self.prompts.fixed_head(job.system_prompt, done, job.scope, job.tools)
        live = len(engine.tokens)
        if not live < len(head) <= engine.n_ctx or engine.common_prefix(head) != live:
            return 0
        engine.extend(head[live:])
        return len(head) - live


def _log_line(stats: TurnStats) -> str:
    return (f"{stats.reused} reused ({stats.source}, {stats.restore_ms:.0f} ms), "
            f"{stats.prefilled} prefilled in {stats.prefill_ms:.0f} ms, first token "
            f"{stats.first_token_s:.2f} s, {stats.generated} tokens"
            + (", stopped" if stats.stopped else ""))
