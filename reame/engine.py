"""The llama_cpp.Llama wrapper: load, tokenize, evaluate, sample; one sequence (0) of KV.

The engine tracks `tokens`, the exact token list whose KV is live in the context, and
`evaluated`, a counter of every token it has decoded: the cache's whole point is to keep that
counter low, and the tests read it.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import xxhash
from llama_cpp import Llama
from llama_cpp._internals import LlamaSampler

from .batches import CHUNK, Batch, common_prefix, plan, resume_point, shifted, truncated, valid
from .model_file import ModelLoadError, check_model_file, model_fingerprint

log = logging.getLogger(__name__)

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}


class ContextOverflow(ValueError):
    """The tokens to evaluate do not fit in the context window."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None


class TextStream:
    """Turns tokens into text as they arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, engine: "Engine"):
        self._engine = engine
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._engine.token_piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class Engine:
    """One loaded model and its context. Not thread-safe: callers hold a lock."""

    def __init__(self, model_path: Path, *, n_ctx: int, n_threads: int = 0,
                 kv_type: str = "f16", models_dir: Path | None = None, n_batch: int = 512):
        model_path = Path(model_path)
        check_model_file(model_path, models_dir or model_path.parent)
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type {kv_type!r}: expected one of {', '.join(KV_TYPES)}")
        threads = n_threads or os.cpu_count() or 1
        # A quantized V cache needs flash attention in llama.cpp.
        self.kv_type, self.flash_attn = kv_type, kv_type != "f16"
        started = time.perf_counter()
        try:
            self.llm = Llama(
                model_path=str(model_path), n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
                n_threads_batch=threads, verbose=False, flash_attn=self.flash_attn,
                type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type],
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"llama.cpp could not load {model_path}: {exc}") from None
        self.model_path = model_path
        self.n_ctx = self.llm.n_ctx()
        self.fingerprint = model_fingerprint(model_path)
        self.metadata = self.llm.metadata
        self.chat_template: str | None = self.metadata.get("tokenizer.chat_template")
        self._vocab = self.llm._model.vocab
        self.max_token_bytes = self._longest_token()  # to refuse huge texts untokenized
        # A sliding-window model's KV can be saved and restored exactly only while the whole
        # sequence fits in its window (measured on Gemma 3: past it, the restored sequence
        # starts at the window). None: no such limit known.
        n_swa = llama_cpp.llama_model_n_swa(self.llm._model.model)
        self.restore_limit: int | None = n_swa if n_swa > 0 else None
        # Context shift (drop old tokens, move the rest down) needs RoPE-style positions; a
        # sliding-window model's masks depend on absolute positions, so it is not shifted.
        self.can_shift = (self.restore_limit is None and bool(llama_cpp.llama_memory_can_shift(
            llama_cpp.llama_get_memory(self.llm._ctx.ctx))))
        self.tokens: list[int] = []
        self.batches: list[Batch] = []  # the decodes that made the live KV (batches.py)
        self._logits_for = -1  # len(tokens) right after the last decode: its logits are live
        self.evaluated = 0
        self.seq = 0  # the sequence this engine's KV is (issue 15: several)
        # One decode's tokens (a plan's decodes are at most CHUNK), built here rather than by
        # Llama.eval, which knows only sequence 0.
        self._batch = llama_cpp.llama_batch_init(CHUNK, 0, 1)
        log.info("loaded %s (n_ctx %d, %d threads) in %.2f s", model_path.name, self.n_ctx,
                 threads, time.perf_counter() - started)

    @property
    def name(self) -> str:
        return self.model_path.name

    @property
    def kv_fingerprint(self) -> str:
        """What a saved KV state depends on: the model file, the KV layout, the library."""
        return (f"model={self.fingerprint};kv={self.kv_type};flash_attn={int(self.flash_attn)};"
                f"llama-cpp-python={llama_cpp.__version__}")

    def close(self) -> None:
        """Free the model and its context now rather than at garbage collection."""
        self.llm.close()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self.tokens = []
        self.batches = []

    # tokens

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        """Tokenize; special: control tokens written as text ("<|im_end|>") are parsed (a
        chat template's text), else they stay characters (what people write)."""
        if not text:
            return [self.bos_token] if add_bos and self.bos_token >= 0 else []
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    @property
    def bos_token(self) -> int:
        return self.llm.token_bos()

    @property
    def eos_token(self) -> int:
        return self.llm.token_eos()

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def _longest_token(self) -> int:
        """An upper bound of a token's length in bytes, from the vocabulary's texts (they
        spell a byte in one to six bytes: "Ġ", "<0x0A>"), so that n bytes of text are surely
        more than n / this many tokens. About 50 ms for 49k tokens, paid when the model loads."""
        n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        return max(len(llama_cpp.llama_vocab_get_text(self._vocab, t) or b"")
                   for t in range(n_vocab))

    def token_text(self, token: int, *, special: bool = True) -> str:
        return self.token_piece(token, special=special).decode("utf-8", errors="replace")

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return ctypes.string_at(buf, n)

    def is_end(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def text_stream(self) -> TextStream:
        return TextStream(self)

    # the KV of sequence 0

    def common_prefix(self, tokens: list[int]) -> int:
        return common_prefix(self.tokens, tokens)

    def resume_point(self, prompt: list[int], *, complete: bool = True) -> int:
        """How much of prompt the live KV can give without changing the reply (batches.py)."""
        return resume_point(self.batches, self.tokens, prompt, complete=complete)

    def truncate(self, n: int) -> bool:
        """Keep the KV of the first n tokens, or fewer: the cut goes down to the start of the
        decode it falls in (a decode's head alone is not what any plan makes). False when the
        model cannot (then the KV is cleared)."""
        if n >= len(self.tokens):
            return True
        n = max((b.start for b in self.batches if b.start <= n), default=0)
        mem = llama_cpp.llama_get_memory(self.llm._ctx.ctx)
        ok = n > 0 and llama_cpp.llama_memory_seq_rm(mem, 0, n, -1)
        # Never trust a True: sliding-window and recurrent models may keep nothing.
        if ok and llama_cpp.llama_memory_seq_pos_max(mem, 0) != n - 1:
            ok = False
        if not ok:
            self.clear()
            return n == 0
        self.tokens = self.tokens[:n]
        self.batches = truncated(self.batches, n)
        self.llm.n_tokens = n
        self._logits_for = -1
        return True

    def shift(self, at: int, n: int) -> bool:
        """Drop the KV of tokens[at:at + n] and move the tokens after it n positions down,
        without recomputing them (llama.cpp re-rotates their keys at the next decode).
        False, with the KV cleared, if the model cannot or the result is not as expected."""
        if not self.can_shift or n <= 0 or at + n >= len(self.tokens):
            return False
        mem = llama_cpp.llama_get_memory(self.llm._ctx.ctx)
        if not llama_cpp.llama_memory_seq_rm(mem, 0, at, at + n):
            self.clear()
            return False
        llama_cpp.llama_memory_seq_add(mem, 0, at + n, -1, -n)
        tokens = self.tokens[:at] + self.tokens[at + n:]
        if (llama_cpp.llama_memory_seq_pos_min(mem, 0) != 0
                or llama_cpp.llama_memory_seq_pos_max(mem, 0) != len(tokens) - 1):
            self.clear()
            return False
        self.tokens = tokens
        self.batches = shifted(self.batches, at, n)
        self._logits_for = -1
        self.llm.n_tokens = len(tokens)
        self.llm.input_ids[: len(tokens)] = tokens
        return True

    def clear(self, *, zero: bool = True) -> None:
        """Empty the KV. zero=False only marks the cells free (the buffers keep old, finite
        values that no mask lets through): 17 ms saved per restore at n_ctx 8192."""
        mem = llama_cpp.llama_get_memory(self.llm._ctx.ctx)
        llama_cpp.llama_memory_clear(mem, zero)
        self.tokens = []
        self.batches = []
        self._logits_for = -1
        self.llm.n_tokens = 0

    def _decode(self, tokens: list[int], *, kept: bool = False) -> None:
        """One llama.cpp decode of tokens after the live ones; their KV becomes live."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflow(
                f"{len(self.tokens) + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        if len(tokens) > CHUNK:
            raise ValueError(f"a decode of {len(tokens)} tokens: the plan makes at most {CHUNK}")
        start = len(self.tokens)
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0] = self.seq
            batch.logits[i] = i == len(tokens) - 1  # only the last token's logits are read
        batch.n_tokens = len(tokens)
        status = llama_cpp.llama_decode(self.llm._ctx.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        self.llm.n_tokens = start + len(tokens)
        self.tokens.extend(tokens)
        self.batches.append(Batch(start, len(self.tokens), kept))
        self._logits_for = len(self.tokens)
        self.evaluated += len(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Evaluate tokens after the live ones, in the decodes batches.plan() gives for their
        absolute positions."""
        base = len(self.tokens)
        for a, b in plan(base, base + len(tokens)):
            self._decode(tokens[a - base:b - base])

    def prefill(self, prompt: list[int]) -> int:
        """Make the KV hold prompt, reusing what the live KV can give without changing the
        reply (resume_point); return how many tokens were reused. The prompt's last decode is
        evaluated again, so that its logits are there to sample from, unless it was the very
        last decode (type-ahead evaluated this prompt): then its logits are still live, and
        the same bits as evaluating it again."""
        if self.ready_for(prompt):
            return len(prompt)
        self.truncate(self.resume_point(prompt))
        reuse = len(self.tokens)
        self.extend(prompt[reuse:])
        return reuse

    def ready_for(self, prompt: list[int]) -> bool:
        """Whether the KV holds exactly prompt and the logits of its last decode are live."""
        return self._logits_for == len(prompt) == len(self.tokens) and self.tokens == prompt

    def prefill_head(self, head: list[int]) -> None:
        """Make the KV hold head, whole chunks of a longer prompt (a shared-prefix snapshot),
        in the decodes that prompt's own plan makes."""
        if len(head) % CHUNK:
            raise ValueError(f"a head of {len(head)} tokens is not whole chunks of {CHUNK}")
        self.truncate(self.resume_point(head, complete=False))
        self.extend(head[len(self.tokens):])

    def sampler(self, sampling: Sampling) -> LlamaSampler:
        sampler = LlamaSampler()
        if sampling.temperature <= 0:
            sampler.add_greedy()
            return sampler
        seed = sampling.seed if sampling.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED
        sampler.add_top_k(sampling.top_k)
        sampler.add_top_p(sampling.top_p, 1)
        sampler.add_min_p(sampling.min_p, 1)
        sampler.add_temp(sampling.temperature)
        sampler.add_dist(seed)
        return sampler

    def generate(self, sampling: Sampling, max_tokens: int) -> Iterator[int]:
        """Sample after the live tokens; yield each new token (its KV is live once the next is
        asked for).

        Stops at an end-of-generation token (not yielded), after max_tokens, or when the context
        is full.
        """
        sampler = self.sampler(sampling)
        token = None
        for _ in range(max_tokens):
            if token is not None:
                if len(self.tokens) >= self.n_ctx:
                    return
                self._decode([token], kept=True)  # only when another token is wanted after it
            token = sampler.sample(self.llm._ctx, -1)
            if self.is_end(token):
                return
            yield token

    # saving and restoring the KV of sequence 0 (no logits: see DESIGN.md)

    def state(self) -> memoryview:
        """The KV of the live tokens, as llama_state_seq_get_data gives it."""
        ctx = self.llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        return memoryview(buf).cast("B")[:written]

    def restore(self, tokens: list[int], state: memoryview, batches: list[Batch]) -> bool:
        """Load a saved KV for tokens, made by batches; False (and an empty context) if it does
        not take exactly."""
        if not tokens or len(tokens) > self.n_ctx or not valid(batches, len(tokens)):
            return False
        self.clear(zero=False)  # set_data writes every cell it uses
        ctx = self.llm._ctx.ctx
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
        read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0)
        del buf  # the caller may close the mapping under state
        mem = llama_cpp.llama_get_memory(ctx)
        # Never trust the call: check the positions the sequence now holds.
        if (read != len(state) or llama_cpp.llama_memory_seq_pos_min(mem, 0) != 0
                or llama_cpp.llama_memory_seq_pos_max(mem, 0) != len(tokens) - 1):
            self.clear()
            return False
        self.tokens = list(tokens)
        self.batches = list(batches)
        self.llm.n_tokens = len(tokens)
        self.llm.input_ids[: len(tokens)] = tokens
        return True

    def logits_digest(self) -> str:
        """xxh3-64 of the logits after the last evaluated token: the same digest means the
        same distribution to sample from, bit for bit."""
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return xxhash.xxh3_64_hexdigest(ctypes.string_at(ptr, 4 * self.llm.n_vocab()))

    def logits(self) -> "numpy.ndarray":
        """A copy of the logits after the last evaluated token."""
        import numpy

        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return numpy.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).copy()
