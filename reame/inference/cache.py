"""The KV cache of a turn: where the prompt's history comes from, and saving it afterwards.

Sources, best first: the live context (the last turn's KV), the chat's KV file, the file of
the chat it was branched from, a shared-prefix snapshot (same system prompt as an earlier chat), else nothing. Whatever is
chosen, the engine then holds the KV of the longest common prefix with the prompt, verified.

A chat's file can also be restored ahead of its turn (`warm`: when the chat is opened, and
while a turn builds its prompt): the turn then starts with its history live.

Scopes: a user's turns reuse only KV made from that user's own tokens, never another user's,
so that nothing a user can observe (tokens reused, their source, the time to the first token)
depends on what others wrote. Every lookup names its scope (user_scope(): one per user, one
for all on a server without accounts); files carry theirs, the block hashes that find them are
salted with it, and the live KV is cleared when a turn of another scope comes. The one
exception is SHARED: a snapshot of the configured default system prompt's opening, which
every user may reuse. It says nothing about anyone (the administrator's text, kept on disk
whatever users do: made when the model loads, and pinned against eviction).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reame.inference.batches import CHUNK, cold_prefix, resume_point
from reame.inference.engine import Engine, Sequence, common_prefix
from reame.inference.kv.kvfile import TMP_PREFIX
from reame.inference.kv.kvindex import SHARED, FileIndex, prompt_key
from reame.inference.kv.kvstore import BLOCK, TOTALS_NAME, KVStore, block_hashes

log = logging.getLogger(__name__)

# Where restored history comes from when it is read from a file: the chat's own, the chat it
# was branched from, a prefix shared with other chats.
FROM_FILES = ("disk", "branch", "prefix")
MIN_RATE_SAMPLE = 32  # prefills shorter than this say little about the prefill rate


def user_scope(user: str | None) -> str:
    """The cache scope of a user's chats and requests ("": a server without accounts)."""
    return "" if user is None else f"user:{user}"


@dataclass
class Counts:
    lookups: int = 0
    hits: int = 0
    tokens_saved: int = 0  # history tokens not recomputed thanks to disk or prefix


@dataclass
class Restored:
    reused: int  # prompt tokens whose KV is live after prepare()
    source: str  # live / disk / branch / prefix / none
    restore_ms: float = 0.0
    shifted: int = 0  # tokens dropped from the KV by a context shift (nothing recomputed)
    recomputed: bool = False  # a drop the KV could not follow: the kept window is re-evaluated
    typed: tuple[int, int] | None = None  # prompt tokens [start, end) evaluated while typed

    def typed_ahead(self, reused: int) -> int:
        """How many of the reused tokens were evaluated while the message was typed."""
        return max(0, min(reused, self.typed[1]) - self.typed[0]) if self.typed else 0


@dataclass(frozen=True)
class Ahead:
    """Work done for a chat before its turn, which the turn reports as its own: its KV file
    restored when the chat was opened (warm), its next message evaluated while typed."""

    chat_id: int
    source: str  # where the history came from: disk / prefix, else live
    restore_ms: float
    counted: bool  # its restore is in the lookup counts already (done by a prepare)
    typed: tuple[int, int] | None = None  # Restored.typed


@dataclass
class Live:
    """What the cache knows of one engine sequence's live KV, beyond its tokens: whose it is,
    the chat it was last made for, what was done ahead of that chat's next turn, and a chat
    whose own file warm() found unusable."""

    scope: str | None = None  # None: nobody's yet
    chat: int | None = None
    ahead: Ahead | None = None
    missed: int | None = None


@dataclass(frozen=True)
class Drop:
    """Messages just dropped from the front of a chat's window: the prompt they would have
    made (old_prompt) loses old_prompt[at:at + n], and the rest is the new prompt."""

    old_prompt: list[int]
    at: int
    n: int


class KVCache:
    """Puts the right KV into the engine before a turn, and saves it after."""

    def __init__(self, engine: Engine, files: KVStore | None):
        self.engine = engine
        self.files = files  # None: the cache is off, only the live context is reused
        self.prefill_rate = 0.0  # tokens/s, measured on this machine and model
        self.counts: dict[str, Counts] = {}  # per scope
        self._live: dict[int, Live] = {}  # per engine sequence
        self.index = FileIndex(files) if files is not None else None
        self._rates: dict[str, float] = {}  # prefill rates per model, as kept on disk
        self._load_totals()

    @property
    def enabled(self) -> bool:
        return self.files is not None

    @property
    def live(self) -> Live:
        """What is known of the KV of the engine's current sequence."""
        return self._live.setdefault(self.engine.seq.id, Live())

    @property
    def scope(self) -> str | None:
        return self.live.scope

    def live_of(self, seq: Sequence) -> Live:
        """What is known of the KV of seq (any of the engine's sequences)."""
        return self._live.get(seq.id) or Live()

    def has_file(self, chat_id: int) -> bool:
        """Whether the chat has a KV file to restore (its head read, nothing loaded)."""
        return self.files is not None and bool(
            self.files.peek(self.files.chat_path(chat_id), report=False))  # the lookup reports

    def serve(self, scope: str) -> None:
        """Let the live KV serve scope: another scope's KV is cleared first (never reused)."""
        if scope == self.live.scope:
            return
        self.engine.clear()
        self._live[self.engine.seq.id] = Live(scope)

    def _count(self) -> Counts:
        return self.counts.setdefault(self.scope, Counts())

    def prepare(self, chat_id: int | None, prompt: list[int], drop: Drop | None = None, *,
                scope: str = "", parent: int | None = None) -> Restored:
        """Make the engine's KV hold the longest available prefix of prompt that gives the
        same reply as a fresh evaluation would (batches.resume_point).

        With a drop, the KV of the old window (live or from disk) is shifted: the dropped span
        removed, the rest moved down, nothing recomputed. Where the model cannot shift, the
        kept window is re-evaluated (and the result says so). chat_id None: a stateless
        request, found by its tokens only. scope: whose turn it is (only KV of that scope or
        SHARED is reused). parent: the chat this one was branched from, whose file is looked
        at next to the chat's own."""
        self.serve(scope)
        if drop is None:
            return self._prepare(chat_id, prompt, parent)
        engine = self.engine
        restored = self._prepare(chat_id, drop.old_prompt, parent)
        shifted = restored.reused > drop.at + drop.n and engine.shift(drop.at, drop.n)
        reuse = engine.resume_point(prompt)
        if not engine.truncate(reuse):
            reuse = 0
        source = restored.source if reuse else "none"
        if shifted:
            return Restored(reuse, source, restored.restore_ms, shifted=drop.n)
        log.info("chat %s: the KV cannot follow the dropped messages (%s): re-evaluating the "
                 "kept window", chat_id, "model cannot shift" if not engine.can_shift
                 else "no KV of the old window")
        return Restored(reuse, source, restored.restore_ms, recomputed=True)

    def _prepare(self, chat_id: int, prompt: list[int], parent: int | None) -> Restored:
        engine = self.engine
        usable = len(prompt) - 1  # the last token is always evaluated, for its logits
        live = engine.resume_point(prompt)
        state = self.live
        live_chat, state.chat = state.chat, chat_id
        ahead, state.ahead = state.ahead, None
        missed, state.missed = state.missed, None
        if ahead is not None and ahead.chat_id == chat_id and live:
            # Restored when the chat was opened or while the turn built its prompt, or typed
            # ahead: this turn's own work (up to where the prompt differs, after an edit).
            if not ahead.counted:
                counts = self._count()
                counts.lookups += 1
                counts.hits += 1
                counts.tokens_saved += live
            return Restored(live, ahead.source, ahead.restore_ms, typed=ahead.typed)
        # The live KV is this chat's own (its file holds the same tokens): nothing to look up.
        if self.files is None or live >= usable or (
                live and chat_id is not None and live_chat == chat_id):
            return Restored(live, "live" if live else "none")
        counts = self._count()
        counts.lookups += 1
        started = time.perf_counter()
        # The chat's own file, if warm() just found it unusable, is not read (nor logged) twice.
        restored = self._restore(chat_id, prompt, live, own=missed != chat_id, parent=parent)
        ms = (time.perf_counter() - started) * 1000
        if restored is not None:
            counts.hits += 1
            counts.tokens_saved += restored.reused
            restored.restore_ms = ms
            return restored
        # Nothing better on disk: whatever still matches in the context is reused.
        live = engine.resume_point(prompt)
        return Restored(live, "live" if live else "none", ms)

    def holds(self, chat_id: int) -> bool:
        """Whether the live KV is this chat's (its last turn, or its restore on opening)."""
        return self.live.chat == chat_id and bool(self.engine.tokens)

    def warm(self, chat_id: int, scope: str = "") -> Restored | None:
        """Restore the chat's KV file now, ahead of its next turn; None if there is nothing
        to restore or the live context already holds it (the chat's last turn left it there:
        its own KV, which the turn knows best how to reuse). scope: the chat's owner's."""
        if self.files is None:
            return None
        self.serve(scope)
        if self.holds(chat_id):
            return None
        tokens = self.files.peek(self.files.chat_path(chat_id))
        if not tokens:
            self.live.missed = chat_id
            return None
        if self.engine.common_prefix(tokens) == len(tokens):
            return None
        started = time.perf_counter()
        restored = self._restore(chat_id, tokens + [-1], 0)
        if restored is None or restored.source != "disk":
            self.live.missed = chat_id
        if restored is not None:
            restored.restore_ms = (time.perf_counter() - started) * 1000
            self.live.ahead = Ahead(chat_id, restored.source, restored.restore_ms,
                                    counted=False)
            self.live.chat = chat_id
        return restored

    def typed(self, chat_id: int, restored: Restored, end: int) -> None:
        """Note that chat's next prompt was evaluated up to end while its message was typed
        (restored: how its prepare found the history); the chat's turn reports it."""
        start = restored.reused if restored.typed is None else min(restored.typed[0],
                                                                   restored.reused)
        found = restored.source in FROM_FILES
        self.live.ahead = Ahead(chat_id, restored.source if found else "live",
                                restored.restore_ms if found else 0.0, counted=True,
                                typed=(start, end))

    def _restore(self, chat_id: int, prompt: list[int], live: int, *,
                 own: bool = True, parent: int | None = None) -> Restored | None:
        """Load the file that gives most of prompt (beyond live tokens), cut where its reuse
        keeps the reply the same (batches.resume_point); own=False: not the chat's own file."""
        engine = self.engine
        ranked = []  # (reach, order, source, path): the farthest first, then the own file
        farthest = live
        candidates = self.index.candidates(chat_id, prompt, self.scope, own=own, parent=parent)
        for order, (source, path, bound) in enumerate(candidates):
            if farthest >= bound:
                break  # no file from here on shares more of the prompt
            head = self.files.head(path)
            if head is None or not self._readable(head.scope, source):
                continue
            reach = resume_point(head.batches, head.tokens, prompt)
            if reach > live:
                ranked.append((reach, -order, source, path))
                farthest = max(farthest, reach)
        for reach, _, source, path in sorted(ranked, reverse=True):
            entry = self.files.read(path)
            if entry is None:
                continue
            with entry:
                if not self._readable(entry.scope, source):
                    continue  # replaced since its head was read
                ok = engine.restore(entry.tokens, entry.state, entry.batches)
                if not entry.verified():
                    engine.clear()
                    self.files.reject(path, "checksum mismatch (corrupt or truncated)")
                    continue
            if not ok:
                self.files.reject(path, "llama.cpp did not take the state back exactly")
                continue
            if not engine.truncate(reach):
                log.warning("KV of %s cannot be cut at %d tokens (sliding window or recurrent "
                            "model): recomputing", path.name, reach)
                continue
            return Restored(reach, source)
        return None

    def _readable(self, scope: str, source: str) -> bool:
        """Whether a file of scope may serve the live scope: its own, or SHARED (a prefix)."""
        return scope == self.scope or (scope == SHARED and source == "prefix")

    def record_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_RATE_SAMPLE and seconds > 0:
            rate = tokens / seconds
            self.prefill_rate = (rate if not self.prefill_rate
                                 else 0.8 * self.prefill_rate + 0.2 * rate)

    def prefix_length(self, prefix: list[int], prompt: list[int]) -> int:
        """Where a shared-prefix snapshot of prompt ends: the whole chunks of prefix that
        prompt shares (a chunk boundary is a batch boundary of every prompt's plan)."""
        shared = min(common_prefix(prefix, prompt), len(prompt) - 1)
        return shared - shared % CHUNK

    def restorable(self, n_tokens: int) -> bool:
        limit = self.engine.restore_limit
        return limit is None or n_tokens <= limit

    def wants_snapshot(self, length: int, prompt: list[int], *, shared: bool = False) -> bool:
        """Whether prompt[:length] is worth a snapshot that is not on disk yet. Snapshots are
        found by the chained hash of their last whole block, and hold every token up to length.
        shared: of the SHARED scope (the default system prompt's opening), else the live one."""
        if self.files is None or length < BLOCK or not self.restorable(length):
            return False
        head = self.files.head(self._snapshot_path(prompt[:length], shared))
        return head is None or head.tokens != prompt[:length]

    def _snapshot_path(self, prefix: list[int], shared: bool) -> Path:
        return self.files.prefix_path(block_hashes(prefix, SHARED if shared else self.scope)[-1])

    def save_snapshot(self, prompt: list[int], length: int, *, shared: bool = False) -> bool:
        """Save the live KV as a prefix snapshot, if it is exactly prompt[:length] as a fresh
        evaluation makes it (whole chunks from position 0): any prompt of the scope may reuse
        it. shared: a SHARED snapshot, which every scope may reuse and eviction keeps."""
        engine = self.engine
        if engine.tokens != prompt[:length] or cold_prefix(engine.batches) < length:
            return False
        path = self._snapshot_path(prompt[:length], shared)
        scope = SHARED if shared else self.scope
        if shared:
            self.files.pinned = {path}  # only the current default system prompt's
        self.files.write_later(path, prompt[:length], engine.state(), list(engine.batches),
                               scope)
        self.index.add(path, prompt[:length], list(engine.batches), scope)
        return True

    def share(self, opening: list[int]) -> None:
        """Make sure the KV of opening (the default system prompt's, as whole chunks) is on
        disk as the SHARED snapshot every user may reuse, and keep it from eviction: made when
        the model loads, so that whether it is there never depends on what users did."""
        head = opening[:len(opening) - len(opening) % CHUNK]
        if self.pin_shared(head):
            return
        self.serve(SHARED)
        self.engine.prefill_head(head)
        self.save_snapshot(head, len(head), shared=True)

    def pin_shared(self, prefix: list[int]) -> bool:
        """Keep the SHARED snapshot of prefix (whole chunks) from eviction; False if it is
        not on disk (then it is to be made)."""
        if self.files is None or len(prefix) < BLOCK or not self.restorable(len(prefix)):
            return True  # nothing to keep
        path = self._snapshot_path(prefix, True)
        head = self.files.head(path)
        if head is None or head.tokens != prefix or head.scope != SHARED:
            return False
        self.files.pinned = {path}
        return True

    def save(self, chat_id: int | None) -> float:
        """Queue the chat's KV file with the exact tokens the KV holds (chat_id None: a
        stateless conversation's); return the ms the turn spent on it (copying the state out
        of llama.cpp; the write is in the background)."""
        self._save_totals()
        if chat_id is None:
            return self._save_conversation()
        if self.files is None or not self.engine.tokens:
            return 0.0
        self.live.missed = None
        if not self.restorable(len(self.engine.tokens)):
            # Past a sliding window the state would not come back exactly. The chat's older,
            # shorter file (if any) stays: its tokens are still a valid prefix.
            return 0.0
        return self._save_live(self.files.chat_path(chat_id))

    def _save_conversation(self) -> float:
        """Save the live KV of a stateless conversation, found later by its tokens (named by
        a hash of all of them: two conversations that end in the same block are two files)."""
        tokens = self.engine.tokens
        if self.files is None or len(tokens) < BLOCK or not self.restorable(len(tokens)):
            return 0.0
        key = prompt_key(tokens, self.scope)
        return self._save_live(self.files.prefix_path(key[len("prompt:"):]))

    def _save_live(self, path: Path) -> float:
        started = time.perf_counter()
        tokens, batches = list(self.engine.tokens), list(self.engine.batches)
        self.files.write_later(path, tokens, self.engine.state(), batches, self.scope)
        self.index.add(path, tokens, batches, self.scope)
        return (time.perf_counter() - started) * 1000

    # The figures of the Cache panel outlive a restart: kept beside the files, the prefill
    # rate per model (it turns tokens restored into time saved).

    @property
    def _totals_path(self) -> Path | None:
        return self.files.folder / TOTALS_NAME if self.files is not None else None

    def _load_totals(self) -> None:
        path = self._totals_path
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path else {}
            rates = dict(data.get("prefill_rates", {}))
            rate = rates.get(self.engine.fingerprint, 0.0)
            counts = {str(scope): Counts(*(int(n) for n in numbers))
                      for scope, numbers in data.get("counts", {}).items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("the cache's totals in %s are unreadable (%s): starting from zero",
                        path, exc)
            return
        self._rates = rates
        if isinstance(rate, (int, float)) and rate > 0:
            self.prefill_rate = float(rate)
        self.counts.update(counts)

    def _save_totals(self) -> None:
        """Write the totals (at each save: one small file, the other models' rates as read
        at start-up, not read again)."""
        path = self._totals_path
        if path is None:
            return
        if self.prefill_rate:
            self._rates[self.engine.fingerprint] = round(self.prefill_rate, 2)
        data = {"prefill_rates": self._rates, "counts": {
            scope: [c.lookups, c.hits, c.tokens_saved] for scope, c in self.counts.items()}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A name of this process's own: nodes sharing the folder may write it at once.
            partial = path.with_name(f"{TMP_PREFIX}totals-{os.getpid()}.tmp")
            partial.write_text(json.dumps(data), encoding="utf-8")
            os.replace(partial, path)
        except OSError as exc:
            log.warning("could not keep the cache's totals in %s: %s", path, exc)

    def chats_ready(self, chat_ids: Iterable[int]) -> int:
        """How many of these chats have a KV file of this model to continue from."""
        if self.files is None:
            return 0
        return sum(self.files.chat_path(chat_id).exists() for chat_id in chat_ids)

    def set_disk_budget(self, max_bytes: int) -> None:
        """Keep the KV files within max_bytes from now on (the oldest go first, at once)."""
        if self.files is not None:
            self.files.max_bytes = max_bytes
            self.files.evict()

    def flush(self) -> None:
        """Wait until the queued KV files are written."""
        if self.files is not None:
            self.files.flush()

    def forget(self, chat_id: int) -> None:
        if self.files is not None:
            self.files.delete_chat(chat_id)

    def stats(self, scope: str | None = None) -> dict:
        """Lookups, hits and tokens restored: of one scope, or (None) of the whole server with
        its files (for an administrator)."""
        counts = ([self.counts.get(scope, Counts())] if scope is not None
                  else list(self.counts.values()))
        lookups = sum(c.lookups for c in counts)
        hits = sum(c.hits for c in counts)
        saved = sum(c.tokens_saved for c in counts)
        out = {"enabled": self.enabled, "prefill_tokens_per_s": round(self.prefill_rate, 1),
               "lookups": lookups, "hits": hits,
               "hit_rate": round(hits / lookups, 3) if lookups else None,
               "tokens_restored": saved,
               "time_saved_s": round(saved / self.prefill_rate, 2) if self.prefill_rate else 0.0}
        if self.files is not None and scope is None:
            files = self.files.files()
            out.update(files=len(files), disk_bytes=sum(_size(p) for p in files),
                       max_disk_bytes=self.files.max_bytes, dir=str(self.files.folder),
                       counters=self.files.counters.as_dict())
        return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
