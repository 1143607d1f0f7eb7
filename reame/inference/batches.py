"""How a prompt is split into llama.cpp decodes: the one rule every path follows.

llama.cpp's CPU kernels round differently for different batch shapes (a batch of one token
takes a matrix-vector kernel, a batch of n a matrix-matrix one; some kernels treat the columns
of a batch in groups). A token's KV and logits therefore depend on which decode computed it,
and greedy decoding flips at near ties. So that the cache changes the speed and never the
answer, every prompt is evaluated by the same plan, whatever part of it was reused:

- the prompt's tokens are split at the chunk boundaries 16, 64, 128, 256, ... (every CHUNK,
  after chunks of 16 and 48) up to the conversation's first kept token (its opening and first
  message: what a cold start or another conversation can share), and at multiples of
  KEPT_CHUNK after it (a conversation's later messages: a message typed ahead is reused but
  for its last KEPT_CHUNK tokens); a batch that starts after a reused prefix runs to the next
  boundary;
- generated tokens are evaluated one by one, as they are sampled (or, when several replies
  are written at once, one token of each in one decode: Engine.decode_pending).

Prompt evaluation gains up to chunks of 128: an 840-token prompt of SmolLM2 on this machine
at 246 / 254 / 257 tokens/s in chunks of 64 / 128 / 256, a 600-token prompt of the Qwen2.5-1.5B
shape at 79.7 / 84.2 / 84.5 (Engine.extend timed with CHUNK set to each, medians of 4; chunks
of 16 are 13-17 % slower than 64). Below CHUNK two boundaries: 16, so that a short opening
many prompts share (a template's header, a short system prompt: llama-server reuses such a
prefix from any slot) is a whole chunk, and 64, so that a system prompt of 64-127 tokens is
one too, and gets a shared-prefix snapshot on disk (kvstore.BLOCK: snapshots are found by
their 64-token blocks). Each boundary below CHUNK costs every cold prompt a decode: against
the earlier ramp (16, 32, 64), dropping 32 evaluates a new prompt of 80 / 128 / 800 tokens
1.07 / 1.07 / 1.04x faster on SmolLM2 and 1.05 / 1.03 / 1.03x on the Qwen2.5-1.5B shape;
dropping 64 too would give 1.13 / 1.08 / 1.04x and 1.18 / 1.24 / 1.03x, but a system prompt of
64-127 tokens would then share 16 tokens, live only (bench/first_chunks.py).
After the first reply 16 stays, because a conversation's later
messages are short and typing ahead reuses only whole chunks of them.

(Evaluating the prompt's last token alone as well would let the same prompt reuse all but that
token, but costs every turn a decode, about 20 ms here: the prompt's last chunk is evaluated
again instead.)

The engine records the decodes (Batch) that made its live KV, and a KV file stores them. A
prompt may reuse live or saved KV only up to a batch boundary (`resume_point`), and only
where that reuse gives the bits a fresh evaluation would:

- cold-equivalent: every reused batch is a whole aligned chunk, as this prompt's own plan
  makes it from position 0; then the reply is the one a cold start gives, whoever computed
  the prefix (a shared-prefix snapshot, another conversation's file, the live context);
- continuation: the reused KV runs through tokens this conversation generated (kept batches):
  the prompt continues a conversation whose KV was kept, and gets the reply the uninterrupted
  conversation gets, live or restored from its file. A cold recomputation of such a history
  from its text evaluates the reply's tokens in other batches, and may differ slightly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

# Prompt tokens per decode before a conversation's first kept token (128: where prompt
# evaluation stops gaining, see the module's doc), and after it.
CHUNK = 128
KEPT_CHUNK = 16
# Below CHUNK: 16 (a chat template's header, a short system prompt) and 64 (a system prompt
# worth a snapshot); then every CHUNK. See the module's doc.
RAMP = (16, 64)


class Batch(NamedTuple):
    """One llama.cpp decode of the live KV: tokens [start, end). kept: not a fresh prompt
    chunk (a generated token, or KV moved by a context shift): reusable only as the
    continuation of the conversation that made it."""

    start: int
    end: int
    kept: bool = False


def plan(start: int, end: int, kept_from: int | None = None) -> list[tuple[int, int]]:
    """The decodes that evaluate tokens [start, end) of a prompt: split at the chunk
    boundaries (next_boundary) before kept_from (the position of the conversation's first
    kept token; None: none yet), at multiples of KEPT_CHUNK from it on."""
    bounds, at = [start], start
    while at < end:
        if kept_from is None or at < kept_from:
            at = min(end, next_boundary(at))
        else:
            at = min(end, (at // KEPT_CHUNK + 1) * KEPT_CHUNK)
        bounds.append(at)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def next_boundary(at: int) -> int:
    """The first chunk boundary after position at: 16, 64, then every CHUNK."""
    if at < CHUNK:
        return next((b for b in RAMP if b > at), CHUNK)
    return (at // CHUNK + 1) * CHUNK


def whole_chunks(n: int) -> int:
    """The last chunk boundary at or before n (0: none): how much of n tokens a plan from
    position 0 evaluates in whole chunks."""
    if n < CHUNK:
        return max((b for b in RAMP if b <= n), default=0)
    return n - n % CHUNK


def kept_from(batches: Sequence[Batch]) -> int | None:
    """Where the first kept batch starts (None: none), for plan()."""
    return next((batch.start for batch in batches if batch.kept), None)


def _cold(batch: Batch) -> bool:
    """Whether a fresh evaluation from position 0 of any prompt that holds this batch's tokens
    (and more) makes this very batch: a whole chunk."""
    return (not batch.kept and whole_chunks(batch.start) == batch.start
            and batch.end == next_boundary(batch.start))


def resume_point(batches: Sequence[Batch], tokens: Sequence[int], prompt: Sequence[int], *,
                 complete: bool = True) -> int:
    """How many of prompt's tokens the KV (tokens, made by batches) can give without changing
    the reply: a batch boundary, cold-equivalent or a continuation (see the module's doc).
    complete: prompt is a whole prompt (its last token is always evaluated again)."""
    limit = common_prefix(tokens, prompt)
    if complete:
        limit = min(limit, len(prompt) - 1)
    cold = resume = 0
    is_cold, continues = True, False
    for batch in batches:
        if batch.end > limit:
            break
        resume = batch.end
        if is_cold and _cold(batch):
            cold = batch.end
        else:
            is_cold = False
            continues = continues or batch.kept
    return resume if continues else cold


def reachable(batches: Sequence[Batch], tokens: Sequence[int], prompt: Sequence[int],
              points: Iterable[int] | None, *, complete: bool = True,
              exact: bool = True) -> int:
    """resume_point, where the KV can resume only at some positions (points: its end and
    its marks, kv_memory.py; None: at any batch boundary): the farthest of them that is a
    resume point of prompt itself (0: none). exact=False: any token prompt shares with the
    KV may be reused (reuse_point), not only what keeps the reply bit for bit."""
    if not exact:
        return reuse_point(batches, tokens, prompt, points, complete=complete)
    reach = resume_point(batches, tokens, prompt, complete=complete)
    if points is None or reach == 0:
        return reach
    for at in sorted({p for p in points if 0 < p <= reach}, reverse=True):
        if (at == reach or at in (b.end for b in batches)) and resume_point(
                truncated(batches, at), tokens[:at], prompt, complete=complete) == at:
            return at
    return 0


def reuse_point(batches: Sequence[Batch], tokens: Sequence[int], prompt: Sequence[int],
                points: Iterable[int] | None, *, complete: bool = True) -> int:
    """How many of prompt's tokens the KV (tokens, made by batches) gives when every shared
    token is reused, as llama-server does ([cache] exact off): the common prefix, or the
    farthest of points (where a memory that cannot be cut back resumes) within it. The reply
    then depends on the decodes that made the KV: at a near tie it may differ from a cold
    evaluation's (docs/cache.md says how often).

    A whole prompt's last token is evaluated again, for its logits. When the KV holds all of
    prompt and a decode of it ended there (the same prompt evaluated before: a request sent
    again, the same question in a new chat), that decode is made again instead: the same
    logits as the first time, so the same reply."""
    limit = common_prefix(tokens, prompt)
    if complete:
        at = len(prompt)
        if limit >= at and any(b.end == at for b in batches):
            limit = next(b.start for b in batches if b.end == at)
        limit = min(limit, at - 1)
    if points is None:
        return max(limit, 0)
    return max((p for p in points if 0 < p <= limit), default=0)


def replays(batches: Sequence[Batch], tokens: Sequence[int], prompt: Sequence[int], *,
            exact: bool = True) -> bool:
    """Whether the KV's decodes up to prompt's end (tokens start with prompt) are the ones an
    evaluation of prompt makes after resuming from this KV: the logits they left at prompt's
    end are then the very bits that evaluation gives (a kept prompt's logits, reused).
    exact=False: whether a decode ended at prompt's end (its logits are that KV's own, which
    the same prompt sent again reuses whatever decodes made it)."""
    at = len(prompt)
    if list(tokens[:at]) != list(prompt) or at not in (b.end for b in batches):
        return False
    if not exact:
        return True
    start = resume_point(batches, tokens, prompt)
    return [(b.start, b.end) for b in batches if start <= b.start < at] == plan(
        start, at, kept_from(truncated(batches, start)))


def cold_prefix(batches: Sequence[Batch]) -> int:
    """How many leading tokens were made by whole chunks from position 0: the KV any prompt
    starting with them would get from a fresh evaluation."""
    at = 0
    for batch in batches:
        if batch.start != at or not _cold(batch):
            break
        at = batch.end
    return at


def valid(batches: Sequence[Batch], n_tokens: int) -> bool:
    """Whether batches tile [0, n_tokens) in order (what a KV file must hold)."""
    at = 0
    for batch in batches:
        if batch.start != at or batch.end <= batch.start:
            return False
        at = batch.end
    return at == n_tokens


def truncated(batches: Sequence[Batch], n: int, *, split: bool = False) -> list[Batch]:
    """The batches of the first n tokens; n is a batch boundary (a KV cut inside a decode
    would keep bits no decode of the head alone gives, so an exact Engine.truncate never
    makes one). split: n may fall inside a decode ([cache] exact off), whose head is kept
    as a batch of its own, neither a whole chunk nor kept: an exact reuse stops before it."""
    if n not in (0, *(batch.end for batch in batches)):
        if not split:
            raise ValueError(f"{n} tokens is not a batch boundary")
        return [batch if batch.end <= n else Batch(batch.start, n, batch.kept)
                for batch in batches if batch.start < n]
    return [batch for batch in batches if batch.end <= n]


def shifted(batches: Sequence[Batch], at: int, n: int) -> list[Batch]:
    """The batches after tokens [at, at + n) are dropped and the rest moved n positions down:
    everything from at on is kept KV (re-rotated, no longer a fresh evaluation)."""
    out = []
    for batch in batches:
        if batch.end <= at:
            out.append(batch)
            continue
        if batch.start < at:
            out.append(Batch(batch.start, at, True))
        start, end = max(batch.start, at + n) - n, batch.end - n
        if end > start:
            out.append(Batch(start, end, True))
    return out


def encode(batches: Iterable[Batch]) -> list[list[int]]:
    """For a KV file's header: [start, end, kept] with runs of one-token kept batches (the
    generated tokens of a reply) merged into one [start, end, 2]."""
    out: list[list[int]] = []
    for batch in batches:
        single_kept = batch.kept and batch.end - batch.start == 1
        if single_kept and out and out[-1][2] == 2 and out[-1][1] == batch.start:
            out[-1][1] = batch.end
        else:
            out.append([batch.start, batch.end, 2 if single_kept else int(batch.kept)])
    return out


def decode(raw) -> list[Batch] | None:
    """encode()'s output back to batches; None if it is not well formed."""
    if not isinstance(raw, list):
        return None
    out = []
    try:
        for start, end, kind in raw:
            start, end, kind = int(start), int(end), int(kind)
            if kind == 2:
                out.extend(Batch(p, p + 1, True) for p in range(start, end))
            elif kind in (0, 1):
                out.append(Batch(start, end, bool(kind)))
            else:
                return None
    except (TypeError, ValueError):
        return None
    return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens a and b share from the start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
