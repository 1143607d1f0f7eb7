"""What crosses the pipe between the engine's process and the server's: a decoding as its
keeper and the metrics read it, and the engine's facts (what the server's side reads of an
Engine without asking)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field


@dataclass
class DecodingSnapshot:
    """A Decoding's results (decoding.py), without its engine."""

    text: str
    generated: list[int]
    cut: bool
    finished: bool
    complete: bool
    exact_tokens: list[int] | None
    first_at: float | None
    token_times: list[float]
    finish_reason: str
    stop_sequence: str | None
    logprobs: tuple | None

    @classmethod
    def of(cls, decoding) -> "DecodingSnapshot":
        return cls(decoding.text, list(decoding.generated), decoding.cut, decoding.finished,
                   decoding.complete, decoding.exact_tokens, decoding.first_at,
                   list(decoding.token_times), decoding.finish_reason,
                   decoding.stop_sequence, decoding.logprobs)


# The Engine attributes the server's side reads as they were at load (remote/parent.py's
# RemoteEngine has them as its own).
FACTS = ("model_path", "n_ctx", "fingerprint", "kv_fingerprint", "metadata", "chat_template",
         "n_vocab", "max_token_bytes", "together", "exact", "load_s", "weight_bytes", "kv_type",
         "flash_attn", "swa_full", "n_threads", "weights", "kv_bytes_per_token", "slots_wanted",
         "recurrent")


@dataclass
class EngineFacts:
    values: dict = field(default_factory=dict)
    slots: int = 1


def facts_of(engine) -> EngineFacts:
    return EngineFacts({name: getattr(engine, name) for name in FACTS if hasattr(engine, name)},
                       len(engine.sequences))


def packed(exc: BaseException) -> tuple:
    """An exception as it crosses the pipe: its class, args and attributes, rebuilt without
    calling its __init__ (ServerBusy's and Replaced's take other arguments than their args)."""
    value = (type(exc), exc.args, dict(vars(exc)))
    try:
        pickle.dumps(value)
    except Exception:  # something in it does not pickle: its words cross
        value = (RuntimeError, (f"{type(exc).__name__}: {exc}",), {})
    return value


def unpacked(value: tuple) -> BaseException:
    cls, args, state = value
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def settle(asked: dict, lock, message: tuple) -> None:
    """An answer ("ok" or "err", the call's number, its value or packed exception) to the
    Future asked[number] that waits for it, if it still waits; either side of the pipe."""
    kind, number, value = message[:3]
    with lock:
        answer = asked.pop(number, None)
    if answer is None:
        return
    if kind == "ok":
        answer.set_result(value)
    else:
        answer.set_exception(unpacked(value))
