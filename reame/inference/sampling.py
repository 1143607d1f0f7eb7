"""Sampling: how the next token is chosen (Sampling), and the Engine's sampler, generator and
logits (a mixin over Engine's context, its sequences and their decodes), with the replies' next
tokens queued and decoded together (decode_pending)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llama_cpp
import xxhash
from llama_cpp._internals import LlamaSampler

from reame.config.chat_settings import FIELD
from reame.inference.held import HeldSampling, TriggerWatch

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
    # OpenAI's: subtracted from a token's logit once (presence) and per time (frequency) it
    # occurs in the reply so far (llama.cpp's penalties over the tokens sampled).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Log-probabilities of each sampled token and of this many most likely ones (None: none).
    top_logprobs: int | None = None
    # A llama.cpp grammar (GBNF) the reply must follow, e.g. JSON (None: any text).
    grammar: str | None = None
    # When set, the grammar holds the reply only from where this text first occurs in it
    # (a lazy grammar), e.g. "<tool_call>": a tool call begun.
    grammar_trigger: str | None = None


@dataclass(frozen=True)
class TokenChoice:
    """A sampled token's log-probability and the most likely tokens' there, under the model's
    own distribution (its logits' softmax: before logit_bias, penalties and temperature)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class ReplySampler(LlamaSampler):
    """llama.cpp's sampler chain, and the choices it made when log-probabilities are asked;
    a grammar is kept beside the chain (HeldSampling._sample_held says why)."""

    def __init__(self, top_logprobs: int | None, choices: list[TokenChoice] | None = None):
        super().__init__()
        self.top_logprobs = top_logprobs
        self.choices: list[TokenChoice] = [] if choices is None else choices
        self.grammar = None  # a llama_sampler of a grammar, or None
        self.grammar_text = ""  # its GBNF
        self.watch: TriggerWatch | None = None  # a lazy grammar's trigger not yet seen

    def hold_to(self, grammar, text: str, watch: TriggerWatch | None = None) -> None:
        self.grammar, self.grammar_text, self.watch = grammar, text, watch
        self._exit_stack.callback(llama_cpp.llama_sampler_free, grammar)


@dataclass(eq=False)
class Pending:
    """A reply's sampled token waiting to be decoded, and then the token sampled after it."""

    seq: object  # engine.Sequence
    token: int
    sampler: ReplySampler
    next: int | None = None
    error: BaseException | None = None


class Sampler(HeldSampling):
    """Engine's sampling and generation (a mixin: Engine's context, sequences and decodes)."""

    def sampler(self, sampling: Sampling,
                choices: list[TokenChoice] | None = None) -> ReplySampler:
        sampler = ReplySampler(sampling.top_logprobs, choices)
        if sampling.logit_bias:
            sampler.add_logit_bias(self.n_vocab, {
                token: -float("inf") if bias <= -100 else bias
                for token, bias in sampling.logit_bias})
        if sampling.frequency_penalty or sampling.presence_penalty:
            sampler.add_penalties(self.n_vocab, self.n_ctx, 1.0, sampling.frequency_penalty,
                                  sampling.presence_penalty)
        if sampling.grammar is not None:
            trigger = sampling.grammar_trigger
            sampler.hold_to(self._grammar_sampler(sampling.grammar, trigger), sampling.grammar,
                            None if trigger is None else TriggerWatch(trigger))
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

    def generate(self, sampling: Sampling, max_tokens: int, *, queued: bool = False,
                 choices: list[TokenChoice] | None = None) -> Iterator[int | None]:
        """Sample after the live tokens; yield each new token (its KV is live once the next is
        asked for). The sequence and its logits are the ones this generator started with;
        another sequence may run between two steps.

        queued: each token is queued for decoding (decode_pending decodes the queued tokens of
        every reply being written, together unless exact_under_load) and None is yielded while
        it waits;
        the scheduler calls decode_pending after each round of steps. A token still queued
        when the generator resumes is decoded then, alone. Otherwise each token is decoded
        at once, alone.

        Stops at an end-of-generation token (not yielded), after max_tokens, or when the context
        is full. choices: where each sampled token's TokenChoice goes when sampling asks for
        log-probabilities (an end token's too).
        """
        if max_tokens <= 0:
            return
        sampler, seq = self.sampler(sampling, choices), self.seq
        token = self._sample(sampler, seq)
        try:
            for left in range(max_tokens - 1, -1, -1):
                if self.is_end(token):
                    return
                # Only when another token is wanted after it is a token decoded.
                seq.decode_ahead = queued and left > 0 and len(seq.tokens) < self.n_ctx
                yield token
                seq.decode_ahead = False
                if not left or len(seq.tokens) >= self.n_ctx:
                    return
                if queued:
                    token = yield from self._next_queued(seq, token, sampler)
                else:
                    if self.seq is not seq:
                        raise RuntimeError("generate() resumed on another sequence")
                    self._decode([token], kept=True)
                    token = self._sample(sampler, seq)
        finally:
            seq.decode_ahead = False

    def _next_queued(self, seq, token: int, sampler: ReplySampler):
        pending = Pending(seq, token, sampler)
        self._pending.append(pending)
        try:
            yield None
        finally:
            if pending in self._pending:  # not decoded (stopped, or nobody decoded it)
                self._pending.remove(pending)
        if pending.next is None and pending.error is None:
            self._decode_alone(pending)
        if pending.error is not None:
            raise pending.error
        return pending.next

    def decode_pending(self) -> None:
        """Decode the replies' queued tokens and sample each one's next token: in one
        llama_decode for all of them, or one per reply (exact_under_load, or a reply alone:
        then the same decode as without a queue)."""
        pending, self._pending = sorted(self._pending, key=lambda p: p.seq.id), []
        if not pending:
            return
        if len(pending) == 1 or not self.together:
            for one in pending:
                self._decode_alone(one)
            return
        try:
            self._decode_rows([(one.seq, [one.token], True) for one in pending])
        except RuntimeError as exc:
            for one in pending:
                one.error = exc
            return
        self.decoded_together += len(pending)
        for one in pending:
            self._sample_into(one)

    def _decode_alone(self, pending: Pending) -> None:
        try:
            self._decode([pending.token], kept=True, seq=pending.seq)
        except Exception as exc:  # the reply that queued it raises it
            pending.error = exc
            return
        self._sample_into(pending)

    def _sample_into(self, pending: Pending) -> None:
        try:
            pending.next = self._sample(pending.sampler, pending.seq)
        except Exception as exc:
            pending.error = exc

    def _sample(self, sampler: ReplySampler, seq) -> int:
        row = self._row(seq)
        if sampler.grammar is None:
            token = sampler.sample(self._ctx, row)
        else:
            token = self._sample_held(sampler, row)
        if sampler.top_logprobs is not None:
            sampler.choices.append(self._choice(row, token, sampler.top_logprobs))
        return token

    def _choice(self, row: int, token: int, top: int) -> TokenChoice:
        import numpy

        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx.ctx, row),
                                          shape=(self.n_vocab,)).astype(numpy.float64)
        peak = logits.max()
        logprobs = logits - (peak + numpy.log(numpy.exp(logits - peak).sum()))
        best = numpy.argpartition(-logprobs, top)[:top] if top else numpy.array([], dtype=int)
        best = best[numpy.argsort(-logprobs[best], kind="stable")]
        return TokenChoice(token, float(logprobs[token]),
                           tuple((int(t), float(logprobs[t])) for t in best))

    def _row(self, seq) -> int:
        """The row of llama.cpp's logits that holds seq's, from the last decode."""
        row = self._live.get(seq.id)
        if row is None:
            raise RuntimeError("the live logits are another sequence's")
        return row

    def _logits_ptr(self):
        return llama_cpp.llama_get_logits_ith(self._ctx.ctx, self._row(self.seq))

    def logits_digest(self) -> str:
        """xxh3-64 of the logits after the last evaluated token: the same digest means the
        same distribution to sample from, bit for bit."""
        return xxhash.xxh3_64_hexdigest(ctypes.string_at(self._logits_ptr(), 4 * self.n_vocab))

    def logits(self) -> numpy.ndarray:
        """A copy of the logits after the last evaluated token."""
        import numpy

        return numpy.ctypeslib.as_array(self._logits_ptr(), shape=(self.n_vocab,)).copy()
