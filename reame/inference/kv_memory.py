"""The memory of one engine sequence: what kind llama.cpp gives the model, cutting it back,
shifting it, saving and restoring it, and the marks where it may resume exactly.

Three kinds of memory, and what each allows:

- dense attention (SmolLM2, Qwen2.5, Llama): the KV of every position is kept, so the
  sequence can be cut back to any batch boundary and goes on exactly from there;
- a sliding window (Gemma 3: 512 tokens on most layers): llama.cpp keeps a window layer's KV
  of the last n_swa positions only, reuses the cells that fall out of it, and saves only
  those. Cut back within the first n_swa tokens it is whole; past them a cut would lose
  positions the next token still sees;
- recurrent or hybrid (LFM2, Qwen3.5, Granite 4.0-H: convolution or state-space layers
  beside attention): a recurrent layer keeps one state, after the last token. It cannot be
  cut back at all.

A memory that cannot be cut back resumes exactly only where its state was copied out: its end
(what a live sequence or a KV file holds), or a Mark. The engine marks the state at the
positions a later turn may resume from (llama-server's context checkpoints): where a turn
resumed (the kept turn's end: an edit of the next message resumes there), its prompt's end
(a regenerate resumes there) and, on a recurrent memory, its prompt's last decode's start (a
draft typed on resumes there, where a dense memory is cut back to). A mark at the prompt's end also keeps that prompt's last
logits, on every kind of memory, so that the same prompt again evaluates nothing, live or
restored from a file (a recurrent state cannot evaluate its last token again).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import llama_cpp

from reame.inference.batches import Batch, reachable, shifted, truncated, valid

MAX_MARKS = 2  # per sequence: the last turn's resume point and its prompt's end
# and, on a recurrent memory, its prompt's last decode's start (where a draft typed on, or
# an edit of the message's end, resumes: a sliding window is cut back there while it fits)
MAX_RECURRENT_MARKS = 3


@dataclass(eq=False)
class Mark:
    """A position the sequence can resume at exactly: the part of its memory that cannot be
    cut back, copied out there (partial_state(); None: the memory can be cut back to it), and
    the logits its last decode made (None: not kept)."""

    at: int
    state: bytes | memoryview | None = None
    logits: ctypes.Array | None = None


@dataclass(eq=False)
class Sequence:
    """One llama.cpp sequence of the context (a slot): the exact tokens whose KV it holds, the
    decodes that made it (batches.py), and len(tokens) right after its last decode."""

    id: int
    tokens: list[int] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    logits_for: int = -1
    # Its reply's next step only decodes the token its caller was given (sampling.py): the
    # scheduler may take that step before the caller asks for the next token.
    decode_ahead: bool = False
    evaluated: int = 0  # tokens its decodes evaluated, all told
    decode_s: float = 0.0  # and the time they took
    # Where it may resume exactly besides its end (the module's doc), oldest first; each
    # dropped once the KV before its position changes.
    marks: list[Mark] = field(default_factory=list)

    @property
    def prompt_logits(self) -> Mark | None:
        """The mark that keeps the last prompt's logits, if any."""
        return next((m for m in reversed(self.marks) if m.logits is not None), None)


class SequenceMemory:
    """Engine's memory methods (a mixin: Engine's context, model and current sequence)."""

    def _init_memory(self) -> None:
        model = self._model.model
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(model)
                              or llama_cpp.llama_model_is_hybrid(model))
        n_swa = llama_cpp.llama_model_n_swa(model)
        self.n_swa: int | None = n_swa if n_swa > 0 else None
        # Context shift (drop old tokens, move the rest down) needs RoPE-style positions: a
        # sliding window's masks depend on absolute positions, and a recurrent state cannot
        # lose a span from its middle (llama.cpp's hybrid memory says it can shift: its
        # attention part can).
        self.can_shift = (self.n_swa is None and not self.recurrent and bool(
            llama_cpp.llama_memory_can_shift(self._memory)))

    @property
    def kind(self) -> str:
        return "recurrent" if self.recurrent else "sliding window" if self.n_swa else "dense"

    def cuttable(self, n_tokens: int) -> bool:
        """Whether a sequence of n_tokens (live, or restored from a file) can be cut back to
        any batch boundary exactly (the module's doc)."""
        return not self.recurrent and (self.n_swa is None or n_tokens < self.n_swa)

    def resume_points(self, tokens: list[int], marks) -> list[int] | None:
        """Where a sequence of tokens with these marks (their positions, those with a state)
        can resume exactly; None: at any batch boundary."""
        if self.cuttable(len(tokens)):
            return None
        return [len(tokens), *marks]

    def resume_point(self, prompt: list[int], *, complete: bool = True) -> int:
        """How much of prompt the live KV can give without changing the reply (batches.py),
        at a position it can resume from exactly."""
        seq = self.seq
        points = self.resume_points(seq.tokens, [m.at for m in seq.marks
                                                 if m.state is not None])
        return reachable(seq.batches, seq.tokens, prompt, points, complete=complete,
                         exact=self.exact)

    @property
    def _memory(self):
        return llama_cpp.llama_get_memory(self._ctx.ctx)

    def _whole(self, n: int) -> bool:
        """Whether the current sequence's memory is what a decode at position n needs: the
        positions up to n - 1, from 0 (dense), from the window's start (a sliding window's
        layers keep no more) or the last one (a recurrent state is one state, after it)."""
        mem, seq = self._memory, self.seq.id
        low = llama_cpp.llama_memory_seq_pos_min(mem, seq)
        floor = n - 1 if self.recurrent else max(0, n - self.n_swa) if self.n_swa else 0
        return 0 <= low <= floor and llama_cpp.llama_memory_seq_pos_max(mem, seq) == n - 1

    def truncate(self, n: int) -> bool:
        """Keep the KV of the first n tokens, or fewer: exactly ([cache] exact), the cut goes
        down to the start of the decode it falls in (a decode's head alone is not what any
        plan makes); a memory that cannot be cut back goes back to a mark's state there.
        False when neither can be done (then the KV is cleared)."""
        seq = self.seq
        if n >= len(seq.tokens):
            return True
        if self.exact:
            n = max((b.start for b in seq.batches if b.start <= n), default=0)
        mark = next((m for m in seq.marks if m.at == n and m.state is not None), None)
        if mark is not None and not self.cuttable(len(seq.tokens)):
            return self._back_to(n, mark.state)
        ok = (n > 0 and self.cuttable(len(seq.tokens))
              and llama_cpp.llama_memory_seq_rm(self._memory, seq.id, n, -1))
        # Never trust a True: sliding-window and recurrent models may keep nothing.
        if ok and not self._whole(n):
            ok = False
        if not ok:
            self.clear()
            return n == 0
        seq.tokens, seq.batches = seq.tokens[:n], truncated(seq.batches, n, split=not self.exact)
        seq.logits_for = -1
        seq.marks = [m for m in seq.marks if m.at <= n]
        return True

    def shift(self, at: int, n: int) -> bool:
        """Drop the KV of tokens[at:at + n] and move the tokens after it n positions down,
        without recomputing them (llama.cpp re-rotates their keys at the next decode).
        False, with the KV cleared, if the model cannot or the result is not as expected."""
        if not self.can_shift or n <= 0 or at + n >= len(self.tokens):
            return False
        mem, seq = self._memory, self.seq
        if not llama_cpp.llama_memory_seq_rm(mem, seq.id, at, at + n):
            self.clear()
            return False
        llama_cpp.llama_memory_seq_add(mem, seq.id, at + n, -1, -n)
        tokens = seq.tokens[:at] + seq.tokens[at + n:]
        if not self._whole(len(tokens)):
            self.clear()
            return False
        seq.tokens, seq.batches, seq.logits_for = tokens, shifted(seq.batches, at, n), -1
        seq.marks = []
        return True

    def clear(self) -> None:
        """Empty the current sequence's KV. Its cells are only marked free: their old, finite
        values are masked out of every later decode (17 ms saved per restore at n_ctx 8192
        against zeroing them)."""
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq.id, -1, -1)
        seq = self.seq
        seq.tokens, seq.batches, seq.logits_for, seq.marks = [], [], -1, []

    # marks

    def mark(self, *, logits: bool = False) -> None:
        """Mark the current sequence's end as a position to resume at: its state copied out
        where its memory cannot be cut back to it later, and the logits of its last decode
        (logits=True: the end of a prompt just evaluated). The oldest mark goes beyond
        MAX_MARKS."""
        seq = self.seq
        at = len(seq.tokens)
        kept = self._copy_logits() if logits else None
        if at == 0 or (logits and kept is None):
            return
        state = None if self.cuttable(self.n_ctx) else bytes(self.partial_state())
        if state is None and kept is None:
            return  # nothing a cut back would not give
        # Only the last prompt's logits are kept: an older mark keeps its state alone (a new
        # Mark: a file being written may hold the old one).
        older = [m if not logits or m.logits is None else Mark(m.at, m.state)
                 for m in seq.marks if m.at != at]
        older = [m for m in older if m.state is not None or m.logits is not None]
        most = MAX_RECURRENT_MARKS if self.recurrent else MAX_MARKS
        seq.marks = older[-(most - 1):] + [Mark(at, state, kept)]

    def _copy_logits(self) -> ctypes.Array | None:
        """A copy of the logits the current sequence's last decode made (a vocabulary of
        floats, 0.6 MB for Qwen2.5's), if they are live and of its last token."""
        seq = self.seq
        row = self._live.get(seq.id)
        if row is None or seq.logits_for != len(seq.tokens):
            return None
        kept = (ctypes.c_float * self.n_vocab)()
        ctypes.memmove(kept, llama_cpp.llama_get_logits_ith(self._ctx.ctx, row),
                       ctypes.sizeof(kept))
        return kept

    def recallable(self, prompt: list[int]) -> bool:
        """Whether the KV holds prompt (and maybe more), made by the decodes that evaluated
        prompt last (no cut or shift before its end since), it can resume exactly there, and
        the logits that prompt's last decode made are kept: the same prompt again (a
        regenerate, a request sent again) evaluates nothing, and samples from the very bits
        an evaluation of its last chunk gives again."""
        seq, at = self.seq, len(prompt)
        mark = seq.prompt_logits
        return (mark is not None and mark.at == at and at <= len(seq.tokens)
                and seq.tokens[:at] == prompt and any(b.end == at for b in seq.batches)
                and (at == len(seq.tokens) or mark.state is not None
                     or self.cuttable(len(seq.tokens))))

    def _recall(self, at: int) -> bool:
        """Go back to the prompt of the kept logits (at) and put those logits in a row of
        llama.cpp's output (the current sequence's, else another's, whose logits are then no
        longer live: it evaluates its last chunk again if it needs them). False if the
        sequence could not go back there (then it is cleared)."""
        seq = self.seq
        kept = seq.prompt_logits.logits
        if not self._live and not self._open_output_row():
            return False
        if not self.truncate(at) or len(seq.tokens) != at:
            return False
        row = self._live.get(seq.id, next(iter(self._live.values())))
        ctypes.memmove(llama_cpp.llama_get_logits_ith(self._ctx.ctx, row), kept,
                       ctypes.sizeof(kept))
        self._live = {s: r for s, r in self._live.items() if r != row}
        self._live[seq.id], seq.logits_for = row, at
        seq.marks = [m for m in seq.marks if m.at <= at]
        return True

    def _open_output_row(self) -> bool:
        """Give llama.cpp an output row to hold kept logits, when no decode made one yet in
        this context (a restored sequence in a new process): one token decoded after the
        current sequence's and taken back at once, its state put back. It evaluates no
        prompt token and is not counted as one; it costs one token's decode."""
        seq = self.seq
        n = len(seq.tokens)
        back = None if self.cuttable(n + 1) else bytes(self.partial_state())
        batch = self._batch
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = seq.tokens[-1], n, 1
        batch.seq_id[0][0], batch.logits[0], batch.n_tokens = seq.id, True, 1
        if llama_cpp.llama_decode(self._ctx.ctx, batch) != 0:
            self.clear()
            return False
        self._live = {seq.id: 0}
        seq.logits_for = -1
        if back is None:
            ok = bool(llama_cpp.llama_memory_seq_rm(self._memory, seq.id, n, -1))
            if ok and self._whole(n):
                return True
            self.clear()
            return False
        seq.tokens.append(seq.tokens[-1])  # what the KV holds until _back_to takes it back
        return self._back_to(n, back)

    # saving and restoring the KV of the current sequence

    def state(self) -> memoryview:
        """The KV of the live tokens, as llama_state_seq_get_data gives it."""
        ctx, seq = self._ctx.ctx, self.seq.id
        size = llama_cpp.llama_state_seq_get_size(ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq)
        return memoryview(buf).cast("B")[:written]

    def partial_state(self) -> memoryview:
        """The part of the live KV that cannot be cut back, as llama_state_seq_get_data_ext
        gives it with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent state (its
        attention layers' KV left out), a sliding window's layers (Gemma 3's full-attention
        layers left out). A mark keeps this: the rest is the sequence's own KV before the
        mark, which a cut back keeps."""
        ctx, seq, flags = self._ctx.ctx, self.seq.id, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags)
        return memoryview(buf).cast("B")[:written]

    def _back_to(self, n: int, partial) -> bool:
        """Take the current sequence back to its first n tokens with the partial state
        (partial_state()) copied out when it held just those: that part put back, the rest
        (attention layers that keep every position) cut at n. False, with the KV cleared,
        if it does not take exactly."""
        seq = self.seq
        view = memoryview(partial)
        if view.readonly:
            view = memoryview(bytearray(view))
        buf = (ctypes.c_uint8 * len(view)).from_buffer(view)
        read = llama_cpp.llama_state_seq_set_data_ext(
            self._ctx.ctx, buf, len(view), seq.id, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        del buf
        view.release()
        ok = (read == len(partial) and n <= len(seq.tokens)
              and llama_cpp.llama_memory_seq_rm(self._memory, seq.id, n, -1)
              and self._whole(n))
        if not ok:
            self.clear()
            return False
        seq.tokens, seq.batches = seq.tokens[:n], truncated(seq.batches, n, split=not self.exact)
        seq.logits_for = -1
        seq.marks = [m for m in seq.marks if m.at <= n]
        return True

    def restore(self, tokens: list[int], state, batches: list[Batch],
                marks: list[Mark] | None = None) -> bool:
        """Load a saved KV (of any sequence) for tokens, made by batches, with the marks that
        go with it; False (and an empty sequence) if it does not take exactly."""
        if not tokens or len(tokens) > self.n_ctx or not valid(batches, len(tokens)):
            return False
        self.clear()  # set_data writes every cell it uses
        view = memoryview(state)
        if view.readonly:
            view = memoryview(bytearray(view))  # ctypes takes a writable buffer only
        buf = (ctypes.c_uint8 * len(view)).from_buffer(view)
        read = llama_cpp.llama_state_seq_set_data(self._ctx.ctx, buf, len(view), self.seq.id)
        del buf  # the caller may close the mapping under state
        view.release()
        # Never trust the call: check the positions the sequence now holds.
        if read != len(state) or not self._whole(len(tokens)):
            self.clear()
            return False
        seq = self.seq
        seq.tokens, seq.batches = list(tokens), list(batches)
        seq.marks = [m for m in marks or () if 0 < m.at <= len(tokens)]
        return True
