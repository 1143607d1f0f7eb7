"""Sampling: how the next token is chosen (Sampling), and the Engine's sampler, generator and
logits (a mixin over Engine's context, its current sequence and its last decode)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llama_cpp
import xxhash
from llama_cpp._internals import LlamaSampler

from reame.config.chat_settings import FIELD

if TYPE_CHECKING:
    import numpy


@dataclass(frozen=True)
class Sampling:
    temperature: float = FIELD["temperature"].default  # a new chat's (chat_settings.py)
    top_p: float = FIELD["top_p"].default
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    # (token, bias) added to the token's logit before sampling; -100 or less bans it (as
    # OpenAI's logit_bias does).
    logit_bias: tuple[tuple[int, float], ...] = ()


class Sampler:
    """Engine's sampling (a mixin: Engine's context, sequences and decodes)."""

    def sampler(self, sampling: Sampling) -> LlamaSampler:
        sampler = LlamaSampler()
        if sampling.logit_bias:
            sampler.add_logit_bias(self.n_vocab, {
                token: -float("inf") if bias <= -100 else bias
                for token, bias in sampling.logit_bias})
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
        asked for). Each step (decode the last token, sample the next) is done at once, so
        another sequence may run between two: the sequence and its logits are the ones this
        generator started with.

        Stops at an end-of-generation token (not yielded), after max_tokens, or when the context
        is full.
        """
        sampler, seq = self.sampler(sampling), self.seq
        token = None
        for _ in range(max_tokens):
            if self.seq is not seq:
                raise RuntimeError("generate() resumed on another sequence")
            if token is not None:
                if len(seq.tokens) >= self.n_ctx:
                    return
                self._decode([token], kept=True)  # only when another token is wanted after it
            if self._last is not seq:
                raise RuntimeError("generate() found another sequence's logits")
            token = sampler.sample(self._ctx, -1)
            if self.is_end(token):
                return
            yield token

    def _logits_ptr(self):
        if self._last is not self.seq:
            raise RuntimeError("the live logits are another sequence's")
        return llama_cpp.llama_get_logits_ith(self._ctx.ctx, -1)

    def logits_digest(self) -> str:
        """xxh3-64 of the logits after the last evaluated token: the same digest means the
        same distribution to sample from, bit for bit."""
        return xxhash.xxh3_64_hexdigest(ctypes.string_at(self._logits_ptr(), 4 * self.n_vocab))

    def logits(self) -> numpy.ndarray:
        """A copy of the logits after the last evaluated token."""
        import numpy

        return numpy.ctypeslib.as_array(self._logits_ptr(), shape=(self.n_vocab,)).copy()
