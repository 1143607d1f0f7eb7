"""Sampling held to a grammar (a mixin over Engine's context and vocabulary): checking a
grammar, sampling so that llama.cpp's grammar is never handed a token it refused (it aborts the
process then), and a lazy grammar's trigger found as the reply comes (TriggerWatch)."""

from __future__ import annotations

import ctypes
import re

import llama_cpp

from reame.config.refusals import ChatError
from reame.inference.grammar_bounds import GrammarError, check_grammar_bounds

__all__ = ["GrammarError", "HeldSampling", "NoTokenLeft", "TriggerWatch", "apply_sampler",
           "candidates_of"]


class NoTokenLeft(ChatError):
    """The grammar allows no token that logit_bias leaves: the reply cannot go on. (llama.cpp
    aborts the process when handed a token its grammar refused: it never is.)"""

    param = "logit_bias"  # the request's field to blame (an API's error names it)

    def __init__(self):
        super().__init__("'logit_bias' bans every token the grammar ('response_format' or "
                         "'tools') allows at this point of the reply: it cannot go on")


class TriggerWatch:
    """Where a lazy grammar's trigger text first occurs in the reply, found as tokens come:
    each token's text is searched with the few bytes before it only, so a step costs the same
    however long the reply (llama.cpp matches its trigger regex against the whole reply at
    every token: 2.9 s a token by 9,600 characters). Once found, the tokens from the one that
    holds the trigger's start on are the ones the grammar is handed (and llama.cpp's regex
    then runs over those few tokens only)."""

    def __init__(self, trigger: str):
        self.trigger = trigger.encode("utf-8")
        self.total = 0  # bytes of the reply so far
        self.tail = b""  # its last len(trigger) - 1 bytes
        self.recent: list[tuple[int, int]] = []  # (token, where its bytes end) over the tail
        self.since_trigger = b""

    def seen(self, token: int, piece: bytes) -> list[int] | None:
        """Take the reply's next token (its bytes as llama.cpp's grammar reads them); the
        tokens to hand the grammar once the trigger is complete, None before. since_trigger
        is then the reply's bytes from the trigger's start on."""
        text, begins = self.tail + piece, self.total - len(self.tail)
        self.total += len(piece)
        self.recent.append((token, self.total))
        at = text.find(self.trigger)
        if at >= 0:
            self.since_trigger = text[at:]
            return [t for t, end in self.recent if end > begins + at]
        self._keep(text)
        return None

    def skip(self) -> None:
        """The trigger just found does not start what the grammar allows: watch for the next."""
        self._keep(self.since_trigger[len(self.trigger):])

    def _keep(self, text: bytes) -> None:
        self.tail = text[-(len(self.trigger) - 1):] if len(self.trigger) > 1 else b""
        self.recent = [(t, end) for t, end in self.recent if end > self.total - len(self.tail)]


class HeldSampling:
    """Engine's sampling under a grammar (a mixin: Engine's context and vocabulary)."""

    _byte_tokens: dict[int, int] | None = None  # byte -> a token that is that byte alone

    def check_grammar(self, grammar: str, trigger: str | None = None) -> None:
        """GrammarError when llama.cpp cannot follow the grammar (GBNF): its parser's words
        are in the log. A grammar can be hundreds of rules: checked once, before a turn."""
        llama_cpp.llama_sampler_free(self._grammar_sampler(grammar, trigger))

    def _grammar_sampler(self, grammar: str, trigger: str | None):
        check_grammar_bounds(grammar)  # before llama.cpp's recursive parser sees it
        text, root = grammar.encode("utf-8"), b"root"
        if trigger is None:
            made = llama_cpp.llama_sampler_init_grammar(self._model.vocab, text, root)
        else:  # the grammar starts where the trigger's text does
            pattern = r"[\s\S]*?(" + re.escape(trigger) + r")[\s\S]*"
            patterns = (ctypes.c_char_p * 1)(pattern.encode("utf-8"))
            made = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                self._model.vocab, text, root, patterns, 1, (llama_cpp.llama_token * 0)(), 0)
        if not made:  # llama.cpp's parser refused it (and logged why)
            raise GrammarError("llama.cpp's grammar parser refused it")
        return made

    def _sample_held(self, sampler, row: int) -> int:
        """Sample under a grammar as llama.cpp's own server does: the chain picks a token
        from every candidate, and only when the grammar refuses that token are the candidates
        held to the grammar and the chain asked again. Holding every candidate at every step
        walks the grammar once per token of the vocabulary: 1.5 s a token with Gemma 3's
        262k, where this costs one walk when the model writes what the grammar wants.

        The grammar is never handed a token it refused (llama.cpp aborts the process then):
        when the chain's biases leave it none, NoTokenLeft. A lazy grammar is left alone until
        its trigger shows in the reply (TriggerWatch)."""
        import numpy

        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx.ctx, row),
                                          shape=(self.n_vocab,))
        if sampler.watch is not None:  # not triggered yet: the grammar holds nothing
            token, _ = apply_sampler(sampler.sampler, candidates_of(logits))
            llama_cpp.llama_sampler_accept(sampler.sampler, token)
            watch = sampler.watch
            replay = watch.seen(token, self.token_piece(token, special=True))
            if replay is not None:
                if self._grammar_takes(sampler.grammar_text, watch.since_trigger):
                    sampler.watch = None
                    for earlier in replay:
                        llama_cpp.llama_sampler_accept(sampler.grammar, earlier)
                else:  # e.g. "<tool_call>x": no call the grammar allows; it stays text
                    watch.skip()
            return token
        token, _ = apply_sampler(sampler.sampler, candidates_of(logits))
        alone = candidates_of(logits[token:token + 1], first=token)
        apply_sampler(sampler.grammar, alone)
        if not numpy.isfinite(alone["logit"][0]):  # refused: choose among what it allows
            candidates = candidates_of(logits)
            apply_sampler(sampler.grammar, candidates)
            token, logit = apply_sampler(sampler.sampler, candidates)
            if token < 0 or not numpy.isfinite(logit):  # the chain's bias banned them all
                raise NoTokenLeft()
        llama_cpp.llama_sampler_accept(sampler.grammar, token)
        llama_cpp.llama_sampler_accept(sampler.sampler, token)
        return token

    def _grammar_takes(self, grammar: str, text: bytes) -> bool:
        """Whether the grammar, from its start, allows text: fed to a fresh copy of it byte
        by byte through the vocabulary's one-byte tokens, each checked before it is accepted
        (llama.cpp aborts the process on a refused one). False if a byte has no such token."""
        import numpy

        if self._byte_tokens is None:
            found: dict[int, int] = {}
            for token in range(self.n_vocab):
                piece = self.token_piece(token, special=True)
                if len(piece) == 1 and not self.is_end(token):
                    found.setdefault(piece[0], token)
            self._byte_tokens = found
        probe = self._grammar_sampler(grammar, None)
        try:
            for byte in text:
                token = self._byte_tokens.get(byte)
                if token is None:
                    return False
                alone = candidates_of(numpy.zeros(1, dtype=numpy.float32), first=token)
                apply_sampler(probe, alone)
                if not numpy.isfinite(alone["logit"][0]):
                    return False
                llama_cpp.llama_sampler_accept(probe, token)
            return True
        finally:
            llama_cpp.llama_sampler_free(probe)


def candidates_of(logits, first: int = 0):
    """llama.cpp's llama_token_data for each logit (token ids from first on), in numpy."""
    import numpy

    data = numpy.zeros(len(logits), dtype=[("id", numpy.int32), ("logit", numpy.float32),
                                           ("p", numpy.float32)])
    data["id"] = numpy.arange(first, first + len(logits), dtype=numpy.int32)
    data["logit"] = logits
    return data


def apply_sampler(sampler, candidates) -> tuple[int, float]:
    """Apply a llama_sampler to the candidates in place; the token it selected and its logit
    there (-1 and -inf if none)."""
    array = llama_cpp.llama_token_data_array(
        data=ctypes.cast(candidates.ctypes.data, llama_cpp.llama_token_data_p),
        size=len(candidates), selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    if array.selected < 0:
        return -1, float("-inf")
    return int(candidates["id"][array.selected]), float(candidates["logit"][array.selected])
