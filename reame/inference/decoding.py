"""A reply's decoding: its tokens sampled one by one into text, cut at the first stop string
(a tail that may begin one held back), with the times, log-probabilities and exact tokens the
keepers and the figures read (turn.py runs it in a turn)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from reame.inference.engine import Engine
from reame.inference.sampling import Sampling


class Decoding:
    """One reply being sampled after the live tokens: its text so far, its exact tokens, and
    its timings. Iterating yields the text so far; a stop string ends it (cut), or ends."""

    def __init__(self, engine: Engine, sampling: Sampling, max_tokens: int,
                 stops: tuple[str, ...], started: float,
                 ends: Callable[[str], int | None] | None = None):
        self.engine, self.sampling, self.max_tokens, self.stops = (
            engine, sampling, max_tokens, stops)
        self.ends = ends
        self.started = started
        self.first_at: float | None = None
        self.token_times: list[float] = []  # when each token came (perf_counter)
        self.generated: list[int] = []
        self._ends: list[int] = []  # the text's length after each generated token
        self.text = ""
        self.cut = False  # ended by a stop string: the tokens run past the text
        self.stop_sequence: str | None = None  # which one (None: cut by `ends`, or not cut)
        self.first_logits = ""
        self.finished = False  # ran to its end (not stopped by the caller)
        self.choices: list = []  # TokenChoice per sampled token, when asked (sampling.py)

    def __iter__(self) -> Iterator[str | None]:
        """The text so far after each token; None while the next token waits to be decoded
        with the other replies' (a step of its own, scheduler.py)."""
        stream = self.engine.text_stream()
        self.first_logits = self.engine.logits_digest()
        for token in self.engine.generate(self.sampling, self.max_tokens, queued=True,
                                          choices=self.choices):
            if token is None:
                yield None
                continue
            now = time.perf_counter()
            if self.first_at is None:
                self.first_at = now
            self.token_times.append(now)
            self.generated.append(token)
            self.text += stream.push(token)
            self._ends.append(len(self.text))
            stop_at, self.stop_sequence = _find_stop(self.text, self.stops)
            if stop_at is None and self.ends is not None:
                stop_at = self.ends(self.text)
            if stop_at is not None:
                self.text, self.cut = self.text[:stop_at], True
                break
            # A tail that may be the start of a stop string waits for the next token: a stop
            # written over several tokens ("color" + "s") must not stream its first part.
            yield self.text[:len(self.text) - _partial_stop(self.text, self.stops)]
        else:
            self.text += stream.flush()
        self.finished = True

    @property
    def logprobs(self) -> tuple | None:
        """The generated tokens' TokenChoices (an end token sampled is not in the reply), or
        None when the sampling asked for none."""
        if self.sampling.top_logprobs is None:
            return None
        return tuple(self.choices[:len(self.generated)])

    @property
    def exact_tokens(self) -> list[int] | None:
        """The tokens that are exactly the reply's text, when it ran to its end: all of them,
        or, cut where a token ended (e.g. before a repeated tool call), those before the cut."""
        if not self.finished:
            return None
        if not self.cut:
            return self.generated
        if len(self.text) not in self._ends:
            return None
        tokens = self.generated[:self._ends.index(len(self.text)) + 1]
        return tokens if self.engine.detokenize(tokens) == self.text else None

    @property
    def complete(self) -> bool:
        """Ran to its end and its tokens are exactly its text (not cut at a stop string)."""
        return self.finished and not self.cut

    @property
    def finish_reason(self) -> str:
        return "length" if not self.cut and len(self.generated) >= self.max_tokens else "stop"

    def record(self, stats) -> None:
        """Fill the stats' reply part (a turn.TurnStats, which imports this module): tokens,
        first token, speed, stopped."""
        now = time.perf_counter()
        first = self.first_at or now
        stats.generated = len(self.generated)
        stats.first_logits = self.first_logits
        stats.first_token_s = first - self.started
        gen_time = now - first
        stats.tokens_per_s = (len(self.generated) - 1) / gen_time if gen_time > 0 else 0.0
        stats.stopped = not self.finished
        stats.at_limit = self.finished and self.finish_reason == "length"


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of text that begins one of stops (0: none)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def _find_stop(text: str, stops: tuple[str, ...]) -> tuple[int | None, str | None]:
    """Where the text ends at the first of stops it holds, and which stop; (None, None)."""
    found = [(text.find(s), n, s) for n, s in enumerate(stops) if s in text]
    if not found:
        return None, None
    at, _, stop = min(found)
    return at, stop
