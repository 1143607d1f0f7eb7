"""Every path of a chat on a hybrid model (tiny LFM2 and Qwen3.5 shapes, tests/tiny_models.py):
a branch's first turn restored from its parent's file (on Gemma 3 past its sliding window
too), a shared opening reused across chats, an attached document, and a chat past its context
window on a model that cannot shift.

A hybrid's recurrent state cannot be cut back (kv_memory.py): each path reuses only a file's
end or its marks, and whatever it reuses must give the bits a cold evaluation of the same
prompt gives (first_logits, and the greedy reply). The tiny models' words are noise; their
memory is the real architectures'.
"""

from __future__ import annotations

from functools import partial

import pytest

from reame.chats.documents import Document, compose
from reame.chats.window import turns_of
from reame.config.reame_conf import GenerationConfig
from reame.inference.batches import CHUNK
from reame.inference.engine import common_prefix
from reame.inference.prompt import PromptMessage
from reame.web.page.render import stats_text

from tests.inference.test_families_restore import Node as FamilyNode

HYBRIDS = ("lfm2", "qwen35")
LONG_SYSTEM = ("You are a meticulous assistant for a public library. " * 30).strip()
SETTINGS = GenerationConfig(system_prompt=LONG_SYSTEM, temperature=0.0, top_p=1.0,
                            max_tokens=12)
TEXT = ("The library keeps old maps of the river valley, letters from the mill owners, "
        "and photographs of the bridge before the flood of that year. ")


# Its turns: the restore tests' Node, with this file's long system prompt.
Node = partial(FamilyNode, settings=SETTINGS)


def cold_twin(folder, path, messages, text):
    """The turn a chat holding messages gives to text with no KV at all."""
    cold = Node(folder, path, cache=False)
    twin = cold.service.new_chat()
    cold.store.copy_messages(twin.id, messages)
    return cold.say(twin.id, text)


def assert_same_bits(turn, cold):
    assert turn.stats.first_logits == cold.stats.first_logits
    assert turn.text == cold.text


@pytest.fixture(params=HYBRIDS)
def hybrid(request):
    return request.getfixturevalue(f"{request.param}_path")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", [*HYBRIDS, "gemma"])
def test_a_branchs_first_turn_restores_from_its_parents_file(tmp_path, request, family):
    hybrid = request.getfixturevalue(f"{family}_path")
    # Gemma 3: a history past its sliding window of 512, which cannot be cut back either.
    n = 8 if family == "gemma" else 3
    texts = (TEXT * n + "Summarize.", TEXT * 2 + "And now?", "Say hello.")
    question = "And a small sea?"
    # The same branch in one uninterrupted sitting: right after the parent's second turn.
    sitting = Node(tmp_path / "sitting", hybrid, cache=False)
    chat = sitting.service.new_chat()
    for text in texts[:2]:
        sitting.say(chat.id, text)
    branch = sitting.service.branch(chat.id, sitting.service.messages(chat.id)[3].id)
    uninterrupted = sitting.say(branch.id, question)

    node = Node(tmp_path, hybrid)
    chat = node.service.new_chat()
    for text in texts:
        node.say(chat.id, text)
    node.flush()
    messages = node.store.messages(chat.id)  # the rows, with their tokens
    # From the last turn's history (where that turn resumed: a mark), and from an earlier
    # reply (no mark there: a hybrid cannot be cut back to it, so the branch is evaluated
    # afresh, from the shared opening at most: a cold evaluation's bits).
    for at in (3,) if family == "gemma" else (3, 1):  # Gemma: the mark (its tokens cost)
        branch = node.service.branch(chat.id, messages[at].id)
        later = Node(tmp_path, hybrid)  # after a restart: nothing live
        turn = later.say(branch.id, question)
        shared = len(later.service.prompts.tokens(
            chat.system_prompt, turns_of(messages[:at + 1], later.engine.fingerprint)))
        s = turn.stats
        assert s.prefilled == s.prompt_tokens - s.reused
        if at == 3:
            assert s.source == "branch" and s.reused >= 0.9 * shared, (s, shared)
            assert "from the chat it branched from" in stats_text(s)
            assert_same_bits(turn, uninterrupted)
        else:
            assert_same_bits(turn, cold_twin(tmp_path / "cold", hybrid, messages[:2], question))


@pytest.mark.timeout(300)
def test_a_shared_opening_serves_a_new_chat_after_a_restart(tmp_path, hybrid):
    node = Node(tmp_path, hybrid)
    one = node.service.new_chat(system_prompt=LONG_SYSTEM)
    node.say(one.id, "Say hello.")
    node.flush()
    assert list((tmp_path / "kv").glob("prefix-*.kv"))
    fresh = Node(tmp_path, hybrid)  # nothing live: only the files
    two = fresh.service.new_chat(system_prompt=LONG_SYSTEM)
    question = "Which planet do we live on?"
    turn = fresh.say(two.id, question)
    prompts = fresh.service.prompts
    shared = common_prefix(prompts.tokens(LONG_SYSTEM, [PromptMessage("user", "Say hello.")]),
                           prompts.tokens(LONG_SYSTEM, [PromptMessage("user", question)]))
    s = turn.stats
    assert s.source == "prefix" and s.reused == shared - shared % CHUNK, (s.reused, shared)
    assert s.prefilled == s.prompt_tokens - s.reused
    assert_same_bits(turn, cold_twin(tmp_path / "cold", hybrid, [], question))


@pytest.mark.timeout(300)
def test_a_chat_with_a_document_continues_after_a_restart(tmp_path, hybrid):
    document = Document("notes.txt", TEXT * 12)
    texts = [compose([document], "What do these notes keep?"), "And the bridge?", "Thanks."]
    sitting = Node(tmp_path / "sitting", hybrid, cache=False)
    chat = sitting.service.new_chat()
    uninterrupted = [sitting.say(chat.id, text) for text in texts][-1]

    node = Node(tmp_path, hybrid)
    chat = node.service.new_chat()
    for text in texts[:2]:
        node.say(chat.id, text)
    node.flush()
    later = Node(tmp_path, hybrid)
    turn = later.say(chat.id, texts[2])
    s = turn.stats
    assert s.source == "disk" and s.reused >= 0.95 * s.prompt_tokens, (s.reused, s.prompt_tokens)
    assert s.prefilled == s.prompt_tokens - s.reused
    assert_same_bits(turn, uninterrupted)


@pytest.mark.timeout(300)
def test_a_hybrid_past_its_window_recomputes_it_and_goes_on(tmp_path, hybrid):
    node = Node(tmp_path, hybrid, n_ctx=512)
    assert not node.engine.can_shift
    chat = node.service.new_chat()
    for n in range(20):
        text = TEXT * 2 + f"Question {n}?"
        last = node.say(chat.id, text)
        if last.stats.dropped_messages:
            break
    else:
        pytest.fail("the window never overflowed")
    s = last.stats
    assert s.window_recomputed and s.shifted == 0
    assert s.prefilled == s.prompt_tokens - s.reused
    assert len(node.engine.tokens) <= 512
    # What the window kept, evaluated with no KV at all, gives the same bits.
    start = node.service.get_chat(chat.id).window_start
    kept = [m for m in node.store.messages(chat.id)[:-2] if m.position >= start]
    assert_same_bits(last, cold_twin(tmp_path / "cold", hybrid, kept, text))
    again = node.say(chat.id, "Say hello.")  # the next turn reuses the new window
    assert again.stats.source == "live" and again.stats.prefilled < 100, again.stats
    node.flush()
    later = Node(tmp_path, hybrid, n_ctx=512)  # and so does a restart
    after = later.say(chat.id, "Thanks.")
    assert after.stats.source == "disk" and after.stats.prefilled < 100, after.stats
