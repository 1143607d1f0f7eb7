"""How much of a prompt the cache gives: every token it shares with the KV by default, as
llama-server does; with [cache] exact, only what keeps the reply a cold start's (whole chunks,
or a kept conversation). The real model, real KV files, a restart in between."""

from __future__ import annotations

import pytest

from reame.config.reame_conf import load_config
from reame.inference.batches import CHUNK
from reame.inference.engine import Engine, common_prefix
from reame.inference.loading import build_engine
from reame.inference.prompt import PromptMessage
from reame.runtime import service_over
from tests.conftest import GREEDY, THREADS, write_config

SYSTEM = GREEDY.system_prompt
HISTORY = [
    PromptMessage("user", "Here are my notes from the trip. " + " ".join(
        f"On day {d} we walked along the river, visited the old market and ate bread with "
        "cheese by the bridge." for d in range(1, 13))),
    PromptMessage("assistant", "Thank you for the notes. It sounds like a calm and happy trip "
                  "with the same good routine every day."),
]
QUESTIONS = ["Which day did we visit the castle?", "What did we eat by the bridge?",
             "Where did we walk each day?"]


class Node:
    def __init__(self, folder, model_path, *, exact=False):
        self.engine = Engine(model_path, n_ctx=2048, n_threads=THREADS, exact_reuse=exact)
        self.service = service_over(folder, self.engine, GREEDY)

    def ask(self, question: str):
        turns = [*HISTORY, PromptMessage("user", question)]
        prompt = self.service.prompts.tokens(SYSTEM, turns)
        last = list(self.service.complete(SYSTEM, turns, max_tokens=8, temperature=0.0))[-1]
        assert last.done and last.stats.prompt_tokens == len(prompt)
        return prompt, last

    def close(self):
        self.service.cache.flush()
        self.engine.close()


@pytest.mark.slow
def test_another_question_on_the_same_history_evaluates_only_what_differs(tmp_path, model_path):
    node = Node(tmp_path, model_path)
    first, _ = node.ask(QUESTIONS[0])
    assert len(first) > 2 * CHUNK
    second, reply = node.ask(QUESTIONS[1])
    shared = common_prefix(first, second)
    assert shared % CHUNK and shared < len(second) - 3  # departs inside a chunk
    stats = reply.stats
    assert (stats.source, stats.reused) == ("live", shared)
    assert stats.prefilled == len(second) - shared
    node.close()

    # After a restart: from the file, the same.
    node = Node(tmp_path, model_path)
    third, reply = node.ask(QUESTIONS[2])
    assert reply.stats.source in ("disk", "prefix")
    assert reply.stats.reused == common_prefix(second, third) > CHUNK
    assert reply.stats.prefilled == len(third) - reply.stats.reused
    node.close()


@pytest.mark.slow
def test_the_same_request_again_after_a_restart_evaluates_nothing_and_gives_the_same_reply(
        tmp_path, model_path):
    node = Node(tmp_path, model_path)
    node.ask(QUESTIONS[0])
    prompt, said = node.ask(QUESTIONS[1])  # resumed inside a chunk
    node.close()
    node = Node(tmp_path, model_path)
    again_prompt, again = node.ask(QUESTIONS[1])
    assert again_prompt == prompt
    assert (again.stats.source, again.stats.reused, again.stats.prefilled) == (
        "prefix", len(prompt), 0)
    assert (again.text, again.stats.first_logits) == (said.text, said.stats.first_logits)
    node.close()


@pytest.mark.slow
def test_with_exact_a_prompt_reuses_only_whole_chunks_of_another_one(tmp_path, model_path):
    node = Node(tmp_path, model_path, exact=True)
    first, _ = node.ask(QUESTIONS[0])
    second, reply = node.ask(QUESTIONS[1])
    shared = common_prefix(first, second)
    assert reply.stats.reused == shared - shared % CHUNK
    assert reply.stats.prefilled == len(second) - reply.stats.reused
    node.close()


@pytest.mark.parametrize("value", [None, "true", "false"])
def test_reame_conf_sets_the_mode(tmp_path, model_path, value):
    extra = "" if value is None else f"\n[cache]\nexact = {value}\n"
    config = load_config(write_config(tmp_path, extra=extra))
    assert config.cache.exact is (value == "true")
    engine = build_engine(config)
    try:
        assert engine.exact is (value == "true")
    finally:
        engine.close()
