"""What the model itself answers on this CPU, computed in the test: the reference a reply is
compared with, instead of a word seen once on one CPU.

llama.cpp picks other kernels on AVX2, AVX-512 and ARM, and they round differently: on a CPU
without AVX-512 SmolLM2 does not answer "Paris" to the capital of France. What a test means by
"Paris" is "the model's own answer to exactly this conversation" (the server sent the right
prompt, kept the history, restored the right cache). So the reference is the model's greedy
reply to the same messages, from a cold prefill in this process (reame's Engine and
PromptBuilder, as a server renders a chat), and a reply must start with the same words.

A follow-up's history holds earlier replies as text here and as their generated tokens on the
server (whose KV was also made otherwise): the last bits may differ, so follow-ups compare
their first word only.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from reame.inference.engine import Engine
from reame.inference.prompt import PromptBuilder, PromptMessage
from reame.inference.sampling import Sampling

from .conftest import GREEDY, MODEL, THREADS

_engines: dict[Path, tuple[Engine, PromptBuilder]] = {}
_lock = threading.Lock()


def model_answer(*messages: str, system_prompt: str = GREEDY.system_prompt,
              max_tokens: int = 24, model_path: Path = MODEL) -> str:
    """The greedy reply to messages (user, assistant, user, ...; the last a user's)."""
    turns = [PromptMessage("user" if i % 2 == 0 else "assistant", text)
             for i, text in enumerate(messages)]
    with _lock:
        if model_path not in _engines:
            engine = Engine(model_path, n_ctx=2048, n_threads=THREADS)
            _engines[model_path] = engine, PromptBuilder(engine)
        engine, prompts = _engines[model_path]
        engine.clear()
        engine.prefill(prompts.tokens(system_prompt, turns))
        tokens = list(engine.generate(Sampling(temperature=0.0), max_tokens))
        text = engine.detokenize(tokens)
    for stop in prompts.stops:  # a model without a chat template: plain turns and their stops
        text = text.split(stop, 1)[0]
    return text.strip()


def words(text: str, n: int) -> list[str]:
    return [w.lower() for w in re.findall(r"\w+", text)][:n]


def assert_answers(reply: str, expected: str, *, n: int = 3) -> None:
    """reply starts as the reference does: its first n words (fewer if either is shorter:
    max_tokens may differ)."""
    got, want = words(reply, n), words(expected, n)
    k = min(len(got), len(want))
    assert k and got[:k] == want[:k], f"{reply!r} does not answer as the model does: {expected!r}"
