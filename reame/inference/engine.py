"""The llama.cpp model and context: load, evaluate; one sequence per slot (its memory: cut,
save, restore, marks, is kv_memory.py's).
Tokens and text are vocab.py's (Vocabulary), sampling is sampling.py's (Sampler).

The engine tracks `tokens`, the exact token list whose KV is live in the context, and
`evaluated`, a counter of every token it has decoded: the cache's whole point is to keep that
counter low, and the tests read it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import llama_cpp
from llama_cpp._internals import LlamaContext, LlamaModel

from reame.config.reame_conf import setting
from reame.inference.batches import (
    CHUNK,
    Batch,
    common_prefix,
    kept_from,
    plan,
    whole_chunks,
)
from reame.inference.kv_memory import Sequence, SequenceMemory
from reame.inference.llama_params import (
    KV_TYPES,
    context_params,
    flash_attention,
    init_backend,
    model_params,
    swa_full_for,
)
from reame.inference.sampling import Pending, Sampler
from reame.inference.vocab import Vocabulary
from reame.models.gguf_info import N_UBATCH, GGUFInfo, read_gguf_info
from reame.models.kv_budget import slots_that_fit
from reame.models.model_file import ModelLoadError, check_model_file, model_fingerprint
from reame.models.repack import Weights, plan_weights

log = logging.getLogger(__name__)


class ContextOverflow(ValueError):
    """The tokens to evaluate do not fit in the context window."""


def drain(steps: Iterator[object]) -> object:
    """Run a generator of steps to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class Engine(SequenceMemory, Vocabulary, Sampler):
    """One loaded model and its context of `slots` sequences. Not thread-safe: one thread
    drives it (scheduler.py), or a caller holds a lock.

    Every KV method works on the current sequence (`use`). Each sequence has its own cells
    (llama.cpp's kv_unified off): a sequence's decodes see exactly what they would see alone,
    so a reply does not depend on who else is talking (README, "Same request, same reply")."""

    def __init__(self, model_path: Path, *, n_ctx: int, n_threads: int = 0,
                 kv_type: str = setting("cache", "kv_type").default,
                 models_dir: Path | None = None, n_batch: int = N_UBATCH, slots: int = 1,
                 kv_budget_bytes: int | None = None,
                 exact_under_load: bool = setting("model", "exact_under_load").default,
                 exact_reuse: bool = setting("cache", "exact").default,
                 mmap: str = setting("model", "mmap").default,
                 flash_attn: str = setting("model", "flash_attn").default,
                 swa_full: bool | None = None):
        model_path = Path(model_path)
        check_model_file(model_path, models_dir or model_path.parent)
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type {kv_type!r}: expected one of {', '.join(KV_TYPES)}")
        threads = self.n_threads = n_threads or os.cpu_count() or 1
        info = _header(model_path)
        self.kv_bytes_per_token = info.kv_bytes_per_token(kv_type) if info else None
        # Mapped, or read into memory where llama.cpp repacks weights (repack.py).
        self.weights = (plan_weights(info, mmap) if info else
                        Weights(mmap != "false", 0, 0, "its header is unreadable"))
        self.slots_wanted = slots
        # The KV the context below takes per slot (swa_full None: swa_full_for decides, off on
        # a sliding window)
        per_slot = info.kv_bytes_per_slot(n_ctx, kv_type, swa_full=bool(swa_full),
                                          n_ubatch=n_batch) if info else None
        slots = slots_that_fit(slots, n_ctx, per_slot, kv_budget_bytes)
        self.kv_type = kv_type
        self.flash_attn, flash_reason = flash_attention(flash_attn, kv_type,
                                                        info.head_dim if info else None)
        started = time.perf_counter()
        init_backend()
        try:
            self._model = LlamaModel(path_model=str(model_path),
                                     params=model_params(self.weights), verbose=False)
            if swa_full is None:  # from the model's window (swa_full_for)
                model = self._model.model
                swa_full = swa_full_for(llama_cpp.llama_model_n_swa(model), bool(
                    llama_cpp.llama_model_is_recurrent(model)
                    or llama_cpp.llama_model_is_hybrid(model)))
            self.swa_full = swa_full
            self._ctx = LlamaContext(model=self._model, params=context_params(
                n_ctx, slots, n_batch, threads, kv_type, self.flash_attn, swa_full),
                verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"llama.cpp could not load {model_path}: {exc}") from None
        self.model_path = model_path
        self.n_ctx = llama_cpp.llama_n_ctx_seq(self._ctx.ctx)  # one sequence's window
        self.fingerprint = model_fingerprint(model_path)
        self.metadata = self._model.metadata()
        self.chat_template: str | None = self.metadata.get("tokenizer.chat_template")
        self._vocab = self._model.vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.max_token_bytes = self._longest_token()  # to refuse huge texts untokenized
        self._init_memory()  # its kind: what a cut back, a shift, a restore can do
        self.sequences = [Sequence(i) for i in range(slots)]
        self.seq = self.sequences[0]  # the sequence the KV methods work on
        # Whose logits the last decode made: sequence id -> row of llama.cpp's logits.
        self._live: dict[int, int] = {}
        self.evaluated = 0
        # Replies' next tokens (sampling.py): decoded together, one llama_decode for all the
        # replies being written, unless exact_under_load (one decode per reply, as alone).
        self.together = not exact_under_load
        # Reuse KV only where the reply stays the cold one ([cache] exact, batches.py), or
        # every token a prompt shares with it.
        self.exact = exact_reuse
        self.decoded_together = 0  # tokens decoded in decodes shared by several replies
        self._pending: list[Pending] = []
        # One decode's tokens: a plan's chunk (at most CHUNK) or one token per slot.
        self._batch = llama_cpp.llama_batch_init(max(CHUNK, slots), 0, 1)
        self.load_s = time.perf_counter() - started  # reported by /metrics
        # What the weights hold in memory, the catalog's memory check reckons with.
        self.weight_bytes = self.weights.resident(model_path.stat().st_size)
        log.info("loaded %s (n_ctx %d, %d slot%s, %d threads) in %.2f s", model_path.name,
                 self.n_ctx, slots, "" if slots == 1 else "s", threads, self.load_s)
        log.info("%s %s: %s", "mapped" if self.weights.mapped else "read into memory",
                 model_path.name, self.weights.reason)
        log.info("flash attention %s: %s", "on" if self.flash_attn else "off", flash_reason)

    @property
    def name(self) -> str:
        return self.model_path.name

    @property
    def kv_fingerprint(self) -> str:
        """What a saved KV state depends on: the model file, the KV layout, the library."""
        return (f"model={self.fingerprint};kv={self.kv_type};flash_attn={int(self.flash_attn)};"
                f"llama-cpp-python={llama_cpp.__version__}")

    @property
    def context(self):
        """llama.cpp's llama_context pointer (for measurements that call llama.cpp directly)."""
        return self._ctx.ctx

    @property
    def n_params(self) -> int:
        return self._model.n_params()

    def set_threads(self, n: int | None = None) -> None:
        """Decode with n threads from the next decode on (None: the engine's own count).
        llama.cpp reads the count as each decode starts."""
        n = n or self.n_threads
        llama_cpp.llama_set_n_threads(self._ctx.ctx, n, n)

    def close(self) -> None:
        """Free the model and its context now rather than at garbage collection."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()
        for seq in self.sequences:
            seq.tokens, seq.batches = [], []

    def __del__(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self.close()

    # the current sequence

    def use(self, seq: Sequence) -> None:
        """Let the KV methods work on seq from now on."""
        self.seq = seq

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens

    @property
    def batches(self) -> list[Batch]:
        return self.seq.batches

    # the KV of the current sequence

    def common_prefix(self, tokens: list[int]) -> int:
        return common_prefix(self.tokens, tokens)

    def _decode(self, tokens: list[int], *, kept: bool = False,
                seq: Sequence | None = None) -> None:
        """One llama.cpp decode of tokens after the live ones of seq (default: the current
        sequence); their KV becomes live."""
        seq = seq or self.seq
        if len(seq.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflow(
                f"{len(seq.tokens) + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        if len(tokens) > CHUNK:
            raise ValueError(f"a decode of {len(tokens)} tokens: the plan makes at most {CHUNK}")
        self._decode_rows([(seq, tokens, kept)])

    def _decode_rows(self, rows: list[tuple[Sequence, list[int], bool]]) -> None:
        """One llama_decode of each (sequence, tokens, kept) after that sequence's live tokens,
        each sequence's last token's logits read; RuntimeError if llama.cpp refuses it."""
        batch, i = self._batch, 0
        for seq, tokens, _ in rows:
            start = len(seq.tokens)
            for k, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + k, 1
                batch.seq_id[i][0] = seq.id
                batch.logits[i] = k == len(tokens) - 1  # only the last token's are read
                i += 1
        batch.n_tokens = i
        self._live = {}  # a failed decode leaves no sequence's logits live
        started = time.perf_counter()
        status = llama_cpp.llama_decode(self._ctx.ctx, batch)
        share = (time.perf_counter() - started) / i
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        row = -1
        for seq, tokens, kept in rows:
            row += len(tokens)
            start = len(seq.tokens)
            seq.tokens.extend(tokens)
            seq.batches.append(Batch(start, len(seq.tokens), kept))
            seq.logits_for, self._live[seq.id] = len(seq.tokens), row
            seq.evaluated += len(tokens)
            seq.decode_s += share * len(tokens)
            self.evaluated += len(tokens)

    def extend_steps(self, tokens: list[int], *, mark_last: bool = False) -> Iterator[None]:
        """Evaluate tokens after the live ones, in the decodes batches.plan() gives for their
        absolute positions; yield between two decodes (a step: scheduler.py may run another
        sequence's there), never after the last, whose logits the caller may sample from.
        mark_last: mark where the last decode starts, if not where the first does."""
        base = len(self.tokens)
        steps = plan(base, base + len(tokens), kept_from(self.batches))
        for i, (a, b) in enumerate(steps):
            if i:
                yield
                if mark_last and i == len(steps) - 1:
                    self.mark()
            self._decode(tokens[a - base:b - base])

    def extend(self, tokens: list[int]) -> None:
        drain(self.extend_steps(tokens))

    def prefill_steps(self, prompt: list[int]) -> Generator[None, None, int]:
        """Make the KV hold prompt, reusing what the live KV can give without changing the
        reply (resume_point); return how many tokens were reused. The prompt's last decode is
        evaluated again, so that its logits are there to sample from, unless it was the very
        last decode (type-ahead evaluated this prompt): then its logits are still live, and
        the same bits as evaluating it again."""
        if self.ready_for(prompt):
            return len(prompt)
        if self.recallable(prompt) and self._recall(len(prompt)):
            return len(prompt)
        self.truncate(self.resume_point(prompt))
        reuse = len(self.tokens)
        if reuse and not any(m.at == reuse and m.state for m in self.seq.marks):
            self.mark()  # where this turn resumed: an edit of its message resumes there
        # A recurrent state cannot be cut back to the last decode's start, which a draft typed
        # on (or an edit of the message's end) resumes from: marked there.
        yield from self.extend_steps(prompt[reuse:], mark_last=self.recurrent)
        self.mark(logits=True)
        return reuse

    def prefill(self, prompt: list[int]) -> int:
        return drain(self.prefill_steps(prompt))

    def ready_for(self, prompt: list[int]) -> bool:
        """Whether the KV holds exactly prompt and the logits of its last decode are live (no
        other sequence decoded since)."""
        seq = self.seq
        return (seq.id in self._live and seq.logits_for == len(prompt) == len(seq.tokens)
                and seq.tokens == prompt)

    def prefill_head_steps(self, head: list[int]) -> Iterator[None]:
        """Make the KV hold head, whole chunks of a longer prompt (a shared-prefix snapshot),
        in the decodes that prompt's own plan makes."""
        if whole_chunks(len(head)) != len(head):
            raise ValueError(f"a head of {len(head)} tokens is not whole chunks")
        self.truncate(self.resume_point(head, complete=False))
        yield from self.extend_steps(head[len(self.tokens):])

    def prefill_head(self, head: list[int]) -> None:
        drain(self.prefill_head_steps(head))


def _header(path: Path) -> GGUFInfo | None:
    try:
        return read_gguf_info(path)
    except (OSError, ValueError):
        return None  # llama.cpp says why it cannot load it
