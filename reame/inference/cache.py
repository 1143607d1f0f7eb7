"""The KV cache of a turn: where the prompt's history comes from, and saving it afterwards.

Sources, best first: the live context (the last turn's KV), the chat's KV file, the file of
the chat it was branched from, a shared-prefix snapshot (same system prompt as an earlier chat), else nothing. Whatever is
chosen, the engine then holds the KV of the longest common prefix with the prompt, verified.

A model whose memory cannot be cut back (a recurrent or hybrid model, a sliding window past its
window: kv_memory.py) resumes from a file only where the file holds its state: its end, or a
mark (the last turn's resume point, its prompt's end, on a hybrid its prompt's last decode's
start). Every file keeps the logits of its last prompt's end, so the same prompt again
evaluates nothing after a restart too.

A chat's file can also be restored ahead of its turn (`restore_ahead`: when the chat is opened, and
while a turn builds its prompt): the turn then starts with its history live.

Scopes: a user's turns reuse only KV made from that user's own tokens, never another user's,
so that nothing a user can observe (tokens reused, their source, the time to the first token)
depends on what others wrote. Every lookup names its scope (scope.py: one per user, one
for all on a server without accounts); files carry theirs, the block hashes that find them are
salted with it, and the live KV is cleared when a turn of another scope comes. The one
exception is SHARED: a snapshot of the configured default system prompt's opening, which
every user may reuse. It says nothing about anyone (the administrator's text, kept on disk
whatever users do: made when the model loads, and pinned against eviction).
"""

from __future__ import annotations

import ctypes
import logging
import time

from reame.inference.batches import (
    cold_prefix,
    reachable,
    replays,
    whole_chunks,
)
from reame.inference.cache_figures import CacheFigures
from reame.inference.cache_state import FROM_FILES, Ahead, Counts, Drop, Live, Restored
from reame.inference.engine import Engine, Sequence, common_prefix
from reame.inference.kv.kvfile import Head, KVEntry
from reame.inference.kv.kvindex import FileIndex, prompt_key
from reame.inference.kv.kvstore import BLOCK, KVStore, block_hashes
from reame.inference.kv_memory import Mark
from reame.inference.scope import NO_ACCOUNTS, SHARED, Scope

log = logging.getLogger(__name__)

class KVCache(CacheFigures):
    """Puts the right KV into the engine before a turn, and saves it after."""

    def __init__(self, engine: Engine, files: KVStore | None):
        self.engine = engine
        self.files = files  # None: the cache is off, only the live context is reused
        self.prefill_rate = 0.0  # tokens/s, measured on this machine and model
        self.counts: dict[Scope, Counts] = {}  # per scope
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
    def scope(self) -> Scope | None:
        return self.live.scope

    def live_of(self, seq: Sequence) -> Live:
        """What is known of the KV of seq (any of the engine's sequences)."""
        return self._live.get(seq.id) or Live()

    def has_file(self, chat_id: int) -> bool:
        """Whether the chat has a KV file to restore (its head read, nothing loaded)."""
        return self.files is not None and bool(
            self.files.peek(self.files.chat_key(chat_id), report=False))  # the lookup reports

    def serve(self, scope: Scope) -> None:
        """Let the live KV serve scope: another scope's KV is cleared first (never reused)."""
        if scope == self.live.scope:
            return
        self.engine.clear()
        self._live[self.engine.seq.id] = Live(scope)

    def _count(self) -> Counts:
        return self.counts.setdefault(self.scope, Counts())

    def prepare(self, chat_id: int | None, prompt: list[int], drop: Drop | None = None, *,
                scope: Scope = NO_ACCOUNTS, parent: int | None = None) -> Restored:
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
        state.chat = chat_id
        ahead, state.ahead = state.ahead, None
        missed, state.missed = state.missed, None
        kept, state.kept = state.kept, None
        if ahead is not None and ahead.chat_id == chat_id and (
                live or engine.ready_for(prompt)):  # (a typed prompt of one decode: ready)
            # Restored when the chat was opened or while the turn built its prompt, or typed
            # ahead: this turn's own work (up to where the prompt differs, after an edit),
            # unless the prompt left that work early and a file gives more (a draft typed
            # before a document was attached: another chat's file of that document).
            if self.files is not None and live < usable and not engine.ready_for(prompt):
                better, _ = self._look_up(chat_id, prompt, live, missed, parent)
                if better is not None:
                    return self._found(better)
            if not ahead.counted:
                counts = self._count()
                counts.lookups += 1
                counts.hits += 1
                self.count_saved(counts, live)
            return Restored(live, ahead.source, ahead.restore_ms, typed=ahead.typed)
        # The live KV is what this chat's last turn left and saved (its file holds the same
        # tokens), or the same prompt again with its logits kept (Engine.recallable): nothing
        # to look up. (Its KV made otherwise since, e.g. a draft typed ahead before a document
        # was attached, may give less than another chat's file.)
        recalled = engine.recallable(prompt)  # all of it, evaluated by prefill (none cut)
        if self.files is None or live >= usable or recalled or (
                live and chat_id is not None and kept == chat_id):
            return Restored(live, "live" if live or recalled else "none")
        restored, ms = self._look_up(chat_id, prompt, live, missed, parent)
        if restored is not None:
            return self._found(restored)
        counts = self._count()
        counts.lookups += 1
        # Nothing better on disk: whatever still matches in the context is reused (another
        # chat's opening). It counts as a hit as a file would: which of the two a turn finds
        # depends on what other users did last, and the figures a user reads must not.
        live = engine.resume_point(prompt)
        if live:
            counts.hits += 1
            self.count_saved(counts, live)
        return Restored(live, "live" if live else "none", ms)

    def _look_up(self, chat_id: int | None, prompt: list[int], live: int, missed: int | None,
                 parent: int | None) -> tuple[Restored | None, float]:
        """The file that gives more of prompt than the live KV (live tokens), restored (None:
        none), and the ms the lookup took."""
        started = time.perf_counter()
        # The chat's own file, if restore_ahead() just found it unusable, is not read (nor
        # logged) twice.
        restored = self._restore(chat_id, prompt, live, own=missed != chat_id, parent=parent)
        ms = (time.perf_counter() - started) * 1000
        if restored is not None:
            restored.restore_ms = ms
        return restored, ms

    def _found(self, restored: Restored) -> Restored:
        """A file's restore, counted as a lookup and a hit."""
        counts = self._count()
        counts.lookups += 1
        counts.hits += 1
        self.count_saved(counts, restored.reused)
        return restored

    def holds(self, chat_id: int) -> bool:
        """Whether the live KV is this chat's (its last turn, or its restore on opening)."""
        return self.live.chat == chat_id and bool(self.engine.tokens)

    def restore_ahead(self, chat_id: int, scope: Scope = NO_ACCOUNTS) -> Restored | None:
        """Restore the chat's KV file now, ahead of its next turn; None if there is nothing
        to restore or the live context already holds it (the chat's last turn left it there:
        its own KV, which the turn knows best how to reuse). scope: the chat's owner's."""
        if self.files is None:
            return None
        self.serve(scope)
        if self.holds(chat_id):
            return None
        tokens = self.files.peek(self.files.chat_key(chat_id))
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
        ranked = []  # (reach, order, source, key): the farthest first, then the own file
        farthest = live
        candidates = self.index.candidates(chat_id, prompt, self.scope, own=own, parent=parent)
        for order, (source, key, bound) in enumerate(candidates):
            if farthest >= bound:
                break  # no file from here on shares more of the prompt
            head = self.files.head(key)
            if head is None or not self._readable(head.scope, source):
                continue
            reach = self._reach(head, prompt)
            if reach > live:
                ranked.append((reach, -order, source, key, common_prefix(head.tokens, prompt)))
                farthest = max(farthest, reach)
        for reach, _, source, key, shared in sorted(ranked, reverse=True):
            entry = self.files.read(key)
            if entry is None:
                continue
            with entry:
                if not self._readable(entry.scope, source):
                    continue  # replaced since its head was read
                ok = self._load(entry, reach)
                if not entry.verified():
                    engine.clear()
                    self.files.reject(key, "checksum mismatch (corrupt or truncated)")
                    continue
            if not ok:
                self.files.reject(key, "llama.cpp did not take the state back exactly")
                continue
            if not engine.truncate(reach):
                log.warning("KV of %s cannot be cut at %d tokens (%s memory): recomputing",
                            key, reach, engine.kind)
                continue
            return Restored(reach, source, shared=shared)
        return None

    def _reach(self, head: Head, prompt: list[int]) -> int:
        """How much of prompt a file can give, at a position its KV resumes from exactly (its
        end, a mark, or any batch boundary where the memory can be cut back): all of prompt
        when the file keeps the logits of prompt's end (the same prompt again)."""
        points = self.engine.resume_points(head.tokens, head.resume_marks())
        at = len(prompt)
        if (head.logits_at(at) and (points is None or at in points)
                and replays(head.batches, head.tokens, prompt, exact=self.engine.exact)):
            return at
        return reachable(head.batches, head.tokens, prompt, points, exact=self.engine.exact)

    def _load(self, entry: KVEntry, reach: int) -> bool:
        """Restore the file's state at its end, with its marks (their states and logits
        copied out of the file); the caller cuts it back to reach, where a mark's state (the
        part of the memory that cannot be cut back alone) takes it back exactly."""
        floats = 4 * self.engine.n_vocab
        marks = [Mark(where, None if state is None else bytes(state),
                      None if logits is None or len(logits) != floats else
                      (ctypes.c_float * self.engine.n_vocab).from_buffer_copy(logits))
                 for where, state, logits in entry.marks]
        return self.engine.restore(entry.tokens, entry.state, entry.batches, marks)

    def _readable(self, scope: Scope, source: str) -> bool:
        """Whether a file of scope may serve the live scope: its own, or SHARED (a prefix)."""
        return scope == self.scope or (scope == SHARED and source == "prefix")

    def prefix_length(self, prefix: list[int], prompt: list[int]) -> int:
        """Where a shared-prefix snapshot of prompt ends: the whole chunks of prefix that
        prompt shares (a chunk boundary is a batch boundary of every prompt's plan)."""
        shared = min(common_prefix(prefix, prompt), len(prompt) - 1)
        return whole_chunks(shared)

    def wants_snapshot(self, length: int, prompt: list[int], *, shared: bool = False) -> bool:
        """Whether prompt[:length] is worth a snapshot that is not on disk yet. Snapshots are
        found by the chained hash of their last whole block, and hold every token up to length.
        shared: of the SHARED scope (the default system prompt's opening), else the live one."""
        if self.files is None or length < BLOCK:
            return False
        head = self.files.head(self._snapshot_key(prompt[:length], shared))
        return head is None or head.tokens != prompt[:length]

    def _snapshot_key(self, prefix: list[int], shared: bool) -> str:
        return self.files.prefix_key(block_hashes(prefix, SHARED if shared else self.scope)[-1])

    def save_snapshot(self, prompt: list[int], length: int, *, shared: bool = False) -> bool:
        """Save the live KV as a prefix snapshot, if it is exactly prompt[:length] as a fresh
        evaluation makes it (whole chunks from position 0): any prompt of the scope may reuse
        it. shared: a SHARED snapshot, which every scope may reuse and eviction keeps."""
        engine = self.engine
        if engine.tokens != prompt[:length] or cold_prefix(engine.batches) < length:
            return False
        key = self._snapshot_key(prompt[:length], shared)
        scope = SHARED if shared else self.scope
        if shared:
            self.files.pinned = {key}  # only the current default system prompt's
        self.files.write_later(key, prompt[:length], engine.state(), list(engine.batches),
                               scope)
        self.index.add(key, prompt[:length], list(engine.batches), scope)
        return True

    def share(self, opening: list[int]) -> None:
        """Make sure the KV of opening (the default system prompt's, as whole chunks) is on
        disk as the SHARED snapshot every user may reuse, and keep it from eviction: made when
        the model loads, so that whether it is there never depends on what users did."""
        head = opening[:whole_chunks(len(opening))]
        if self.pin_shared(head):
            return
        self.serve(SHARED)
        self.engine.prefill_head(head)
        self.save_snapshot(head, len(head), shared=True)

    def pin_shared(self, prefix: list[int]) -> bool:
        """Keep the SHARED snapshot of prefix (whole chunks) from eviction; False if it is
        not on disk (then it is to be made)."""
        if self.files is None or len(prefix) < BLOCK:
            return True  # nothing to keep
        key = self._snapshot_key(prefix, True)
        head = self.files.head(key)
        if head is None or head.tokens != prefix or head.scope != SHARED:
            return False
        self.files.pinned = {key}
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
        self.live.kept = chat_id
        return self._save_live(self.files.chat_key(chat_id))

    def _save_conversation(self) -> float:
        """Save the live KV of a stateless conversation, found later by its tokens (named by
        a hash of all of them: two conversations that end in the same block are two files)."""
        tokens = self.engine.tokens
        if self.files is None or len(tokens) < BLOCK:
            return 0.0
        whole = prompt_key(tokens, self.scope)
        return self._save_live(self.files.prefix_key(whole[len("prompt:"):]))

    def _save_live(self, key: str) -> float:
        started = time.perf_counter()
        tokens, batches = list(self.engine.tokens), list(self.engine.batches)
        self.files.write_later(key, tokens, self.engine.state(), batches, self.scope,
                               self.engine.seq.marks)
        self.index.add(key, tokens, batches, self.scope)
        return (time.perf_counter() - started) * 1000

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
