"""Long chats past the context window, with the real default model at n_ctx 1,024 (768 where
fewer turns overflow it as well).

At an overflow the oldest messages leave the model's window; on SmolLM2 (RoPE) the KV is
shifted, so the turn evaluates only its new tokens; Gemma 3 (sliding window) re-evaluates.
"""

from __future__ import annotations

import dataclasses

import pytest

from reame.chats.service import MessageTooLong
from reame.config.reame_conf import GenerationConfig
from reame.inference.engine import Engine
from reame.runtime import service_over
from reame.web.gradio_api.chat_endpoints import message_dict
from reame.web.page.render import stats_text, to_chatbot

from tests.conftest import THREADS

N_CTX = 1024
SETTINGS = GenerationConfig(system_prompt="You are a helpful assistant.", temperature=0.0,
                            top_p=1.0, max_tokens=32)
# About 130 tokens of context before each question, so that the window fills in a few turns.
FILLER = ("Here are my notes from the garden today: the tomatoes are ripening, the beans climb "
          "the fence, the roses need water, and the soil is dry after a week of sun. ") * 3
# Alternating, so that each reply answers its own question (SmolLM2-135M is small: these two
# it answers right at every length tried, and a broken KV would not).
QUESTIONS = ["What is the capital city of France? Answer in one word.",
             "What is the capital of Italy?"]
ANSWERS = ["Paris", "Rome"]
SMALL_N_CTX = 512  # where a test needs only the window to move, not several overflows
# Two overflows and a restart between them: at 768 in 9 turns (11 at 1,024), each shift
# keeping about 420 tokens, room for the turn after the restart.
SHIFT_N_CTX = 768


class Node:
    """One 'process' over a folder: engine, database, KV files, service."""

    def __init__(self, folder, model_path, n_ctx=N_CTX, settings=SETTINGS):
        self.engine = Engine(model_path, n_ctx=n_ctx, n_threads=THREADS)
        self.service = service_over(folder, self.engine, settings)
        self.store, self.kv = self.service.store, self.service.cache.files

    def turn(self, chat_id, n):
        """Ask question n (cycling) after the filler; return the last update, with the tokens
        evaluated in the turn."""
        before = self.engine.evaluated
        last = list(self.service.send(chat_id, FILLER + QUESTIONS[n % len(QUESTIONS)]))[-1]
        last.evaluated = self.engine.evaluated - before
        return last

    def close(self):
        self.service.cache.flush()
        self.engine.close()


def assert_answers(last, n):
    assert ANSWERS[n % len(ANSWERS)].lower() in last.text.lower(), last.text


def assert_only_new_tokens(last):
    s = last.stats
    assert s.prefilled == s.prompt_tokens - s.reused
    assert s.prefilled < 200, "only the new message: the kept history is not recomputed"
    # every token evaluated is the new message, the reply, or the next turn's fixed head
    assert last.evaluated <= s.prefilled + s.generated + s.ahead


@pytest.mark.slow
def test_a_long_chat_shifts_its_kv_at_each_overflow_and_survives_a_restart(tmp_path,
                                                                           model_path):
    node = Node(tmp_path, model_path, n_ctx=SHIFT_N_CTX)
    chat = node.service.new_chat()
    overflows, n, restarted = [], 0, False
    while len(overflows) < 2:  # one before the restart, one after
        last = node.turn(chat.id, n)
        assert_answers(last, n)
        assert len(node.engine.tokens) <= SHIFT_N_CTX
        if last.stats.shifted:
            overflows.append(last)
            assert last.stats.reused > 0 and last.stats.source in ("live", "disk")
            assert_only_new_tokens(last)
            assert "context shifted" in stats_text(last.stats)
            if len(overflows) == 1 and not restarted:
                node.close()  # restart: the shifted KV comes back from its file
                node, restarted = Node(tmp_path, model_path, n_ctx=SHIFT_N_CTX), True
                n += 1
                after = node.turn(chat.id, n)
                assert after.stats.source == "disk" and after.stats.shifted == 0
                assert after.stats.reused == after.stats.prompt_tokens - after.stats.prefilled
                assert_only_new_tokens(after)
                assert_answers(after, n)
        n += 1
        assert n < 40, "two overflows should come within 40 turns"
    # Every message is still stored; the oldest are marked outside the window.
    chat = node.service.get_chat(chat.id)
    messages = node.service.messages(chat.id)
    assert len(messages) == 2 * n, "every message of every turn is still stored"
    assert messages[0].content.endswith(QUESTIONS[0])
    flags = [message_dict(m, chat.window_start)["in_window"] for m in messages]
    assert flags[0] is False and flags[-1] is True
    assert flags == sorted(flags), "outside the window: a prefix of the chat"
    assert overflows[-1].stats.dropped_messages == flags.count(False)
    assert messages[flags.index(True)].role == "user", "the window starts at a user message"
    shown = to_chatbot(messages, chat.window_start)
    marked = [n for n, m in enumerate(shown) if "outside the model's memory" in m["content"]]
    assert marked == [flags.index(True) - 1], "one marker, where the dropped part ends"
    node.close()


def test_gemma3_cannot_shift_and_re_evaluates_the_kept_window(tmp_path, gemma_path):
    # Replies of at most 12 tokens: Gemma's answers need no more ("The capital of Italy is
    # Rome."), and each of its tokens costs a busy core about 50 ms (262k-word vocabulary).
    # A context of 768: it overflows in 6 turns, not 8, and re-evaluates a kept window of
    # about 540 tokens (680 at 1,024).
    node = Node(tmp_path, gemma_path, n_ctx=768,
                settings=dataclasses.replace(SETTINGS, max_tokens=12))
    assert not node.engine.can_shift
    chat = node.service.new_chat()
    for n in range(40):
        last = node.turn(chat.id, n)
        if last.stats.dropped_messages:
            break
    else:
        pytest.fail("the window never overflowed")
    s = last.stats
    assert s.window_recomputed and s.shifted == 0
    assert "kept window re-evaluated" in stats_text(s)
    assert s.prefilled == s.prompt_tokens - s.reused and s.prefilled > 200
    assert_answers(last, n)
    again = node.turn(chat.id, n + 1)  # and the next turn reuses the new window
    assert again.stats.source == "live" and again.stats.prefilled < 200
    assert_answers(again, n + 1)
    node.close()


@pytest.mark.slow
def test_an_edit_before_the_window_starts_the_window_over(tmp_path, model_path):
    node = Node(tmp_path, model_path, n_ctx=SMALL_N_CTX)  # the window moves in fewer turns
    chat = node.service.new_chat()
    n = 0
    while not node.service.get_chat(chat.id).window_start:
        node.turn(chat.id, n)
        n += 1
    first_user = node.store.messages(chat.id)[0]
    edited = list(node.service.edit_message(chat.id, first_user.id, QUESTIONS[0]))[-1]
    assert_answers(edited, 0)
    assert node.service.get_chat(chat.id).window_start == 0
    assert [m.role for m in node.store.messages(chat.id)] == ["user", "assistant"]
    node.close()


def test_a_message_too_long_for_the_context_is_refused_and_nothing_is_stored(tmp_path,
                                                                           model_path):
    node = Node(tmp_path, model_path)
    chat = node.service.new_chat()
    node.turn(chat.id, 0)
    with pytest.raises(MessageTooLong, match=f"context holds {N_CTX:,} tokens"):
        list(node.service.send(chat.id, "word " * 2000))
    assert len(node.store.messages(chat.id)) == 2
    assert_answers(node.turn(chat.id, 1), 1)
    node.close()
