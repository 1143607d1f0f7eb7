"""The persistent KV cache, with the real default model: count the tokens evaluated."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time

import pytest

from reame.chats.window import turns_of
from reame.inference.batches import KEPT_CHUNK, whole_chunks
from reame.inference.engine import Engine, common_prefix
from reame.inference.kv.kvstore import BLOCK, TOTALS_NAME, KVStore
from reame.inference.prompt import PromptMessage
from reame.runtime import service_over
from reame.web.page.render import stats_text

from tests.conftest import GREEDY, THREADS
from tests.kv_blobs import Backend, kv_blobs  # noqa: F401  (the fixture)
from tests.reference import assert_answers, model_answer

# Every test runs against the blobs REAME_TEST_BLOBS names (tests/kv_blobs.py): the folder,
# the in-memory ones, or both.
pytestmark = pytest.mark.usefixtures("kv_blobs")

LONG_SYSTEM = ("You are a meticulous assistant for a public library. " * 30).strip()


class Node:
    """One 'process': its own engine (an empty context), store, KV store and service.

    Its KV store writes in the background, on a thread of its own: before another node reads
    the folder, flush it (the files a process queued land at its exit)."""

    def __init__(self, folder, model_path, *, enabled=True, kv_type="f16", max_mb=4096,
                 n_ctx=2048, flash_attn="auto"):
        self.engine = Engine(model_path, n_ctx=n_ctx, kv_type=kv_type, n_threads=THREADS,
                             flash_attn=flash_attn)
        self.service = service_over(folder, self.engine, GREEDY, cache=enabled,
                                    max_disk_bytes=max_mb * 1024 * 1024)
        self.store, self.kv = self.service.store, self.service.cache.files

    def say(self, chat_id, text):
        return self.finish(self.service.send(chat_id, text))

    def finish(self, updates):
        before = self.engine.evaluated
        last = list(updates)[-1]
        assert last.done
        last.evaluated = self.engine.evaluated - before
        return last


@pytest.fixture
def folder(tmp_path):
    return tmp_path


def cold_reply(folder, model_path, node, chat_id, text):
    """The reply to text after chat_id's history, computed with no cache from nothing."""
    cold = Node(folder / "cold", model_path, enabled=False)
    twin = cold.service.new_chat(system_prompt=node.service.get_chat(chat_id).system_prompt)
    for m in node.store.messages(chat_id):
        cold.store.add_message(twin.id, m.role, m.content, tokens=m.token_list,
                               tokens_model=m.tokens_model)
    last = cold.say(twin.id, text)
    assert last.stats.reused == 0
    return last.text


def sitting(folder, model_path, script, *, system_prompt=GREEDY.system_prompt, **node):
    """The replies of one uninterrupted conversation with the cache off: the exact reference.

    A restored KV must give bit-identical replies to this. A cold prefill of the whole history
    is close but not bit-identical: llama.cpp's batched and one-token evaluations round
    differently (see close_to_cold)."""
    node = Node(folder, model_path, enabled=False, **node)
    chat = node.service.new_chat(system_prompt=system_prompt)
    return [node.say(chat.id, text).text for text in script]


def close_to_cold(node, chat_id, text, model_path):
    """The first-token logits after the cache's restore vs after a cold prefill of the prompt."""
    service = node.service
    chat = service.get_chat(chat_id)
    turns = turns_of(node.store.messages(chat_id), service.engine.fingerprint) + [
        PromptMessage("user", text)]
    prompt = service.prompts.tokens(chat.system_prompt, turns)
    restored = service.cache.prepare(chat_id, prompt)
    node.engine.prefill(prompt)
    restored_logits = node.engine.logits()
    cold = Engine(model_path, n_ctx=2048, n_threads=THREADS)
    cold.prefill(prompt)
    reference = cold.logits()
    assert restored_logits.argmax() == reference.argmax()
    assert abs(restored_logits - reference).max() / abs(reference).max() < 0.1
    return restored


def kv_tokens(kv: KVStore, chat_id: int) -> list[int]:
    return kv.peek(kv.chat_key(chat_id))


def assert_only_new_tokens_evaluated(last):
    s = last.stats
    assert s.prefilled == s.prompt_tokens - s.reused
    # the reply's tokens are evaluated as they are generated, except the last one; then the
    # next prompt's fixed head ("<|im_end|>\n<|im_start|>user\n"), ahead of the next turn
    assert (s.prefilled + s.generated - 1 + s.ahead <= last.evaluated
            <= s.prefilled + s.generated + s.ahead)


@pytest.fixture
def family(request):
    """A model of each kind of memory (kv_memory.py): SmolLM2 (dense attention), the tiny
    Qwen3.5 shape (a hybrid: a recurrent state beside attention), Gemma 3 (a sliding window)."""
    return request.getfixturevalue({"smollm2": "model_path", "qwen35": "qwen35_path",
                                    "gemma3": "gemma_path"}[request.param])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["smollm2", "qwen35", "gemma3"], indirect=True)
def test_after_a_restart_only_the_new_tokens_are_evaluated(folder, family):
    model_path = family
    first = Node(folder, model_path)
    chat = first.service.new_chat()
    first.say(chat.id, "Which planet do we live on?")
    first.say(chat.id, "What is the capital city of France? Answer in one word.")
    saved = kv_tokens(first.kv, chat.id)
    assert saved == first.engine.tokens, "the file holds exactly the tokens the KV holds"

    first.kv.flush()
    second = Node(folder, model_path)  # a new process: nothing live
    base = second.service.cache_stats()  # the totals kept from the first process
    last = second.say(chat.id, "Say hello.")
    assert last.stats.source == "disk"
    assert last.stats.reused == len(saved), "every token before the new message is reused"
    assert_only_new_tokens_evaluated(last)
    assert last.stats.prefilled < 20
    assert last.text == sitting(folder / "ref", model_path, [
        "Which planet do we live on?", "What is the capital city of France? Answer in one word.",
        "Say hello."])[-1]
    assert "restored" in stats_text(last.stats) and "from disk" in stats_text(last.stats)
    again = second.say(chat.id, "Thank you!")
    assert again.stats.source == "live"
    stats = second.service.cache_stats()
    assert (stats["lookups"] - base["lookups"], stats["hits"] - base["hits"]) == (1, 1), (
        "a continued chat needs no disk lookup")
    second.kv.flush()
    third = Node(folder, model_path)
    assert close_to_cold(third, chat.id, "Thank you!", model_path).source == "disk"


@pytest.mark.slow
def test_with_flash_attention_a_restored_chat_answers_as_the_uninterrupted_one(folder,
                                                                              model_path):
    """[model] flash_attn = true on the default model (auto leaves it off for its 64-wide
    heads): its KV files are its own, and a chat restored from one answers as the
    uninterrupted conversation with flash attention does."""
    script = ["Which planet do we live on?", "Name three fruits.", "Say hello."]
    plain = Node(folder, model_path)
    assert not plain.engine.flash_attn
    chat = plain.service.new_chat()
    for text in script[:2]:
        plain.say(chat.id, text)
    plain.kv.flush()
    first = Node(folder, model_path, flash_attn="true")
    assert first.engine.flash_attn and "flash_attn=1" in first.engine.kv_fingerprint
    assert first.say(chat.id, script[0]).stats.source != "disk", "another setting's file"
    chat = first.service.new_chat()
    for text in script[:2]:
        first.say(chat.id, text)
    first.kv.flush()
    second = Node(folder, model_path, flash_attn="true")
    last = second.say(chat.id, script[2])
    assert last.stats.source == "disk" and last.stats.prefilled < 20
    assert last.text == sitting(folder / "ref", model_path, script, flash_attn="true")[-1]


@pytest.mark.slow
def test_switching_between_three_chats_restores_each(folder, model_path):
    node = Node(folder, model_path)
    questions = ["Which planet do we live on?", "Say hello.",
                 "What is the capital city of France? Answer in one word."]
    chats = [node.service.new_chat(system_prompt=f"You are assistant number {n}.")
             for n in range(3)]
    for chat, question in zip(chats, questions):
        node.say(chat.id, question)
    for n, (chat, question) in enumerate(zip(chats, questions)):
        saved = kv_tokens(node.kv, chat.id)
        reference = sitting(folder / f"ref{n}", model_path, [question, "Thank you!"],
                            system_prompt=f"You are assistant number {n}.")[-1]
        last = node.say(chat.id, "Thank you!")
        assert last.stats.source == "disk" and last.stats.reused == len(saved)
        assert_only_new_tokens_evaluated(last)
        assert last.text == reference


@pytest.mark.slow
def test_opening_a_chat_restores_its_kv_before_the_next_message(folder, model_path):
    node = Node(folder, model_path)
    chat = node.service.new_chat()
    node.say(chat.id, "Which planet do we live on?")
    saved = kv_tokens(node.kv, chat.id)

    node.kv.flush()
    later = Node(folder, model_path)  # a restart, then the user opens the chat
    base = later.service.cache_stats()  # the totals kept from before
    assert later.service.restore_ahead(chat.id)
    assert later.engine.tokens == saved and later.engine.evaluated == 0
    assert not later.service.restore_ahead(chat.id), "already live: nothing to do"
    last = later.say(chat.id, "Say hello.")
    assert last.stats.source == "disk" and last.stats.reused == len(saved)
    assert last.stats.restore_ms > 0, "the restore done at opening is reported with the turn"
    assert_only_new_tokens_evaluated(last)
    stats = later.service.cache_stats()
    assert stats["hits"] - base["hits"] == stats["lookups"] - base["lookups"] == 1
    assert last.text == sitting(folder / "ref", model_path,
                                ["Which planet do we live on?", "Say hello."])[-1]
    unknown = later.service.new_chat()
    assert not later.service.restore_ahead(unknown.id), "no file: nothing to restore"
    off = Node(folder / "off", model_path, enabled=False)
    assert not off.service.restore_ahead(chat.id)



@pytest.mark.slow
def test_a_turn_restores_its_file_while_it_tokenizes_the_prompt(folder, model_path,
                                                                monkeypatch):
    first = Node(folder, model_path)
    chat = first.service.new_chat()
    first.say(chat.id, "Which planet do we live on?")
    saved = kv_tokens(first.kv, chat.id)

    first.kv.flush()
    later = Node(folder, model_path)  # a restart; the chat was not opened (an API client)
    events = []
    restore, tokenize = later.engine.restore, later.engine.tokenize
    restoring_now, restore_started = threading.Event(), threading.Event()

    def restoring(*args, **kwargs):
        events.append(("restore starts", threading.current_thread().name))
        restoring_now.set()
        restore_started.set()
        time.sleep(0.3)  # long enough for the turn's tokenizing to happen meanwhile
        ok = restore(*args, **kwargs)
        restoring_now.clear()
        events.append(("restore ends", threading.current_thread().name))
        return ok

    def tokenizing(*args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            # The engine's thread may not have started the restore yet (the turn's own
            # reads are quick): the point is that the turn does not wait for it to end.
            restore_started.wait(5)
        events.append(("tokenize during the restore" if restoring_now.is_set() else "tokenize",
                       threading.current_thread().name))
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(later.engine, "restore", restoring)
    monkeypatch.setattr(later.engine, "tokenize", tokenizing)
    last = later.say(chat.id, "Say hello.")
    kinds = [kind for kind, _ in events]
    assert kinds.count("restore starts") == 1, "the file is read once"
    assert dict(events)["restore starts"] == "reame-engine", "on the engine's thread"
    assert "tokenize during the restore" in kinds, "the prompt was tokenized meanwhile"
    assert last.stats.source == "disk" and last.stats.reused == len(saved)
    assert last.stats.restore_ms >= 300, "the turn reports the restore it waited for"
    assert_only_new_tokens_evaluated(last)
    assert last.text == sitting(folder / "ref", model_path,
                                ["Which planet do we live on?", "Say hello."])[-1]

def test_queued_writes_of_a_file_land_in_order_and_readers_wait_for_them(folder, kv_blobs):
    kv = KVStore(kv_blobs.at(folder / "kv"), fingerprint="test", max_bytes=1 << 30)
    key = kv.chat_key(1)
    for n in range(1, 6):
        kv.write_later(key, list(range(n)), memoryview(bytes(1 << 20)))
    assert kv.peek(key) == [0, 1, 2, 3, 4], "a reader sees the newest queued write"
    assert [b.key for b in kv.blobs.list()] == [key]
    assert kv_blobs.name != "folder" or not list((folder / "kv").glob("*.tmp"))


def test_regenerate_recomputes_only_the_reply(folder, model_path):
    node = Node(folder, model_path)
    chat = node.service.new_chat()
    # A first message long enough that its prompt holds whole chunks.
    first = node.say(chat.id, "I am writing a school report about the solar system: the sun "
                     "and its eight planets, their moons and rings, how far each one is from "
                     "the sun, and how long its year and its day last. My teacher asked us "
                     "to start simply. Which planet do we live on?")
    again = node.finish(node.service.regenerate(chat.id))
    # The KV still holds the prompt, made by the decodes that evaluated it, and the logits of
    # its last decode were kept: nothing is evaluated but the reply.
    assert again.stats.reused == again.stats.prompt_tokens and again.stats.source == "live"
    assert again.stats.prefilled == 0
    assert again.text == first.text, "greedy: the same prompt, the same decodes, the same reply"
    messages = node.store.messages(chat.id)
    assert [m.role for m in messages] == ["user", "assistant"]
    node.kv.flush()
    # After a restart too: the file keeps the logits of the prompt's end, so nothing is
    # evaluated again, and the reply is the one of one sitting.
    later = Node(folder, model_path)
    third = later.finish(later.service.regenerate(chat.id))
    assert third.stats.source == "disk" and third.stats.prefilled == 0
    assert third.stats.reused == third.stats.prompt_tokens
    assert third.text == again.text


@pytest.mark.slow
def test_edit_reuses_the_kv_up_to_the_edited_message(folder, model_path):
    node = Node(folder, model_path)
    chat = node.service.new_chat()
    node.say(chat.id, "Which planet do we live on?")
    node.say(chat.id, "Say hello.")
    node.say(chat.id, "Thank you!")
    node.kv.flush()
    messages = node.store.messages(chat.id)
    second_user = messages[2]
    later = Node(folder, model_path)
    edited = later.finish(later.service.edit_message(chat.id, second_user.id, "Say goodbye."))
    prompt_before = len(later.service.prompts.tokens(
        GREEDY.system_prompt, turns_of(messages[:2], later.service.engine.fingerprint)))
    assert edited.stats.source == "disk"
    assert edited.stats.reused >= prompt_before - 1
    assert_only_new_tokens_evaluated(edited)
    # A dense model cuts its KV where the chat changed: nothing is read again.
    assert edited.stats.read_again == 0
    after = [(m.role, m.content) for m in later.store.messages(chat.id)]
    assert after[:3] == [(m.role, m.content) for m in messages[:2]] + [("user", "Say goodbye.")]
    assert len(after) == 4
    assert edited.text == sitting(folder / "ref", model_path,
                                  ["Which planet do we live on?", "Say goodbye."])[-1]


@pytest.mark.slow
def test_a_new_chat_restores_a_shared_system_prompt(folder, model_path):
    node = Node(folder, model_path)
    one = node.service.new_chat(system_prompt=LONG_SYSTEM)
    reference = node.say(one.id, "Say hello.").text
    node.kv.flush()  # files are written in the background
    prefixes = [key for key in node.kv.files() if key.startswith("prefix-")]
    assert len(prefixes) == 1

    later = Node(folder, model_path)
    two = later.service.new_chat(system_prompt=LONG_SYSTEM)
    last = later.say(two.id, "Say hello.")
    assert last.stats.source == "prefix"
    prompts = later.service.prompts
    shared = common_prefix(prompts.tokens(LONG_SYSTEM, [PromptMessage("user", "")]),
                           prompts.tokens(LONG_SYSTEM, [PromptMessage("user", "Say hello.")]))
    assert shared % BLOCK, "the test needs a shared opening that ends inside a block"
    # All of the shared opening's whole chunks; here even more: chat one's own file is found
    # by its tokens (the block-hash index), as it starts with this very prompt, and keeps the
    # logits of its end: all of it, nothing evaluated (the same bits as chat one's, made by
    # the decodes a cold start makes).
    assert last.stats.reused == last.stats.prompt_tokens > whole_chunks(shared)
    assert last.stats.prefilled == 0
    later.kv.flush()
    fresh = Node(folder, model_path)  # nothing live: only the snapshot shares this much
    other = fresh.service.new_chat(system_prompt=LONG_SYSTEM)
    planet = fresh.say(other.id, "Which planet do we live on?")
    shared = common_prefix(prompts.tokens(LONG_SYSTEM, [PromptMessage("user", "")]),
                           prompts.tokens(LONG_SYSTEM, [PromptMessage("user", "Which planet")]))
    # Every token it shares with a file, the whole shared opening at least ([cache] exact
    # would stop at a chunk boundary: tests/inference/test_reuse.py).
    assert planet.stats.source == "prefix" and planet.stats.reused >= shared > whole_chunks(shared)
    assert_only_new_tokens_evaluated(last)
    assert_only_new_tokens_evaluated(planet)
    # The same prompt, the same decodes: chat one's reply, word for word.
    assert last.text == reference
    assert planet.text.strip()
    fresh.kv.flush()
    three = later.service.new_chat(system_prompt=LONG_SYSTEM)
    assert close_to_cold(Node(folder, model_path), three.id, "Which planet do we live on?",
                         model_path).source == "prefix"


@pytest.mark.slow
def test_a_lookup_opens_only_files_that_could_give_more(folder, model_path, monkeypatch):
    node = Node(folder, model_path)
    questions = [f"Count to {n}." for n in range(2, 7)]
    replies = [node.finish(node.service.complete(LONG_SYSTEM, [PromptMessage("user", q)])).text
               for q in questions]
    node.kv.flush()
    later = Node(folder, model_path)  # a restart: found by tokens only, through the index
    later.service.cache.index.build()  # once per process, from every file's head
    peeked = []
    head = later.kv.head
    monkeypatch.setattr(later.kv, "head", lambda path, **kw: peeked.append(path) or head(path, **kw))
    turns = [PromptMessage("user", questions[0]), PromptMessage("assistant", replies[0]),
             PromptMessage("user", "Thanks!")]
    last = later.finish(later.service.complete(LONG_SYSTEM, turns))
    assert last.stats.source == "prefix"
    assert last.stats.reused > len(later.service.prompts.tokens(LONG_SYSTEM, turns[:1]))
    # The first conversation's file gives all its tokens; the four others (and the snapshot)
    # share only the system prompt's blocks, so after it none of them is even opened.
    assert len(peeked) == 1, peeked
    assert_only_new_tokens_evaluated(last)


def _corrupt_truncate(blobs, key):
    data = Backend.read(blobs, key)
    blobs.put(key, [data[: len(data) // 2]])


def _corrupt_flip(blobs, key):
    data = bytearray(Backend.read(blobs, key))
    data[len(data) // 2] ^= 0xFF
    blobs.put(key, [bytes(data)])


def _corrupt_old_format(blobs, key):
    data = bytearray(Backend.read(blobs, key))
    data[8:12] = struct.pack("<I", 0)
    blobs.put(key, [bytes(data)])


def _corrupt_garbage(blobs, key):
    blobs.put(key, [os.urandom(5000)])


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_corrupt_truncate, _corrupt_flip, _corrupt_old_format,
                                    _corrupt_garbage], ids=["truncated", "flipped-byte",
                                                            "older-format", "garbage"])
@pytest.mark.parametrize("family", ["smollm2", "qwen35"], indirect=True)
def test_a_damaged_file_is_a_miss_and_is_replaced(folder, family, damage, caplog):
    model_path = family
    node = Node(folder, model_path)
    chat = node.service.new_chat()
    node.say(chat.id, "Which planet do we live on?")
    path = node.kv.chat_key(chat.id)
    node.kv.flush()
    damage(node.kv.blobs, path)
    reference = cold_reply(folder, model_path, node, chat.id, "Say hello.")
    later = Node(folder, model_path)
    with caplog.at_level(logging.WARNING, logger="reame.inference.kv.kvstore"):
        last = later.say(chat.id, "Say hello.")
    assert last.stats.source == "none" and last.stats.reused == 0
    assert last.stats.prefilled == last.stats.prompt_tokens
    assert last.text == reference
    assert later.kv.counters.rejected >= 1
    assert any("not used" in r.message for r in caplog.records)
    assert later.kv.read(path) is not None, "the file was replaced by a good one"
    assert later.kv.peek(path) == later.engine.tokens


def test_a_file_of_another_model_or_kv_type_is_not_restored(folder, model_path):
    node = Node(folder, model_path, kv_type="q8_0")
    chat = node.service.new_chat()
    node.say(chat.id, "Which planet do we live on?")
    q8_file = node.kv.chat_key(chat.id)
    # The f16 node looks for its own file name; give it the q8_0 bytes under that name.
    f16 = Node(folder, model_path, kv_type="f16")
    f16_path = f16.kv.chat_key(chat.id)
    assert f16_path != q8_file, "one file per chat per fingerprint"
    node.kv.flush()
    f16.kv.blobs.put(f16_path, [Backend.read(node.kv.blobs, q8_file)])
    reference = cold_reply(folder, model_path, node, chat.id, "Say hello.")
    last = f16.say(chat.id, "Say hello.")
    assert last.stats.source == "none" and f16.kv.counters.rejected == 1
    assert last.text == reference
    # The q8_0 file is still there for when q8_0 comes back.
    assert node.kv.read(q8_file) is not None


def test_a_failed_write_delivers_the_reply_and_leaves_no_partial_file(folder, model_path,
                                                                      monkeypatch, kv_blobs):
    node = Node(folder, model_path)
    chat = node.service.new_chat()

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    if kv_blobs.name == "folder":  # the file written, then refused at its fsync
        monkeypatch.setattr("reame.config.files.os.fsync", disk_full)
    else:
        monkeypatch.setattr(node.kv.blobs, "put", disk_full)
    last = node.say(chat.id, "Which planet do we live on?")
    assert_answers(last.text, model_answer("Which planet do we live on?"))
    node.kv.flush()
    assert node.kv.counters.write_errors >= 1
    assert [b.key for b in node.kv.blobs.list()] in ([], [TOTALS_NAME])
    assert kv_blobs.name != "folder" or [p.name for p in (folder / "kv").iterdir()] in (
        [], [TOTALS_NAME])
    assert node.store.messages(chat.id)[-1].content == last.text


@pytest.mark.slow
def test_eviction_keeps_the_disk_budget(folder, model_path):
    node = Node(folder, model_path, max_mb=10)  # four chats' files (~3.5 MB each) overflow it
    chats = [node.service.new_chat(system_prompt=f"You are assistant {n}. " + "Be kind. " * 40)
             for n in range(4)]
    for chat in chats:
        node.say(chat.id, "Say hello.")
        node.kv.flush()
        assert node.kv.disk_bytes() <= 10 * 1024 * 1024
    assert node.kv.counters.evicted > 0
    assert node.kv.exists(node.kv.chat_key(chats[-1].id)), "the most recent chat is kept"
    assert not node.kv.exists(node.kv.chat_key(chats[0].id)), (
        "the least recently used went first")


@pytest.mark.slow
def test_files_reame_did_not_write_are_left_alone(folder, model_path, kv_blobs):
    """[cache] dir may be any folder: only Reame's own files (name and magic) are deleted."""
    if kv_blobs.name != "folder":
        pytest.skip("a folder's own case: files that others put in it")
    kv = folder / "kv"
    kv.mkdir()
    foreign = {"notes.kv": b"my notes", "photo.tmp": b"jpeg", "draft.kv.tmp": b"x",
               "chat-1-000000000000.kv": b"not a KV file at all",
               "prefix-abc-000000000000.kv": b"nor this"}
    for name, data in foreign.items():
        (kv / name).write_bytes(data)
    stale = kv / "reame-kv-stale.tmp"
    stale.write_bytes(b"a write cut short")  # Reame's own leftover, an hour old
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    under_way = kv / "reame-kv-other-node.tmp"  # another process's write, under way
    under_way.write_bytes(b"half a file")
    node = Node(folder, model_path, max_mb=8)  # three chats' files (~3.5 MB each) overflow it
    assert not stale.exists()
    assert under_way.exists(), "a fresh temp file may be another node's write"
    under_way.unlink()
    chats = [node.service.new_chat(system_prompt=f"You are assistant {n}. " + "Be kind. " * 40)
             for n in range(3)]
    for chat in chats:
        node.say(chat.id, "Say hello.")
    node.kv.flush()
    assert node.kv.counters.evicted > 0, "the budget made room, from Reame's files only"
    node.kv.sweep(set())
    for chat in chats:
        node.service.delete_chat(chat.id)
    assert {name: (kv / name).read_bytes() for name in foreign} == foreign
    assert [p.name for p in kv.glob("chat-*.kv")] == ["chat-1-000000000000.kv"], (
        "Reame's own chat files went with their chats")


def test_deleting_a_chat_deletes_its_file_and_start_up_sweeps_orphans(folder, model_path):
    node = Node(folder, model_path)
    keep, drop = node.service.new_chat(), node.service.new_chat()
    node.say(keep.id, "Say hello.")
    node.say(drop.id, "Say hello.")
    node.service.delete_chat(drop.id)
    kv = node.kv
    assert not kv.exists(kv.chat_key(drop.id))
    orphan = kv.chat_key(999)
    kv.blobs.put(orphan, [Backend.read(kv.blobs, kv.chat_key(keep.id))])
    assert kv.sweep(node.store.chat_ids()) == 1
    assert not kv.exists(orphan) and kv.exists(kv.chat_key(keep.id))


def test_with_the_cache_off_a_restart_recomputes_everything(folder, model_path, kv_blobs):
    node = Node(folder, model_path, enabled=False)
    chat = node.service.new_chat()
    node.say(chat.id, "Which planet do we live on?")
    later = Node(folder, model_path, enabled=False)
    last = later.say(chat.id, "Say hello.")
    assert last.stats.source == "none" and last.stats.prefilled == last.stats.prompt_tokens
    assert not kv_blobs.made(folder / "kv")


def test_gemma3_sliding_window_restores_short_and_long_chats(folder, gemma_path):
    node = Node(folder, gemma_path)
    assert node.engine.n_swa == 512, "Gemma 3 270M has a 512-token window"
    assert node.engine.cuttable(511) and not node.engine.cuttable(512)
    short = node.service.new_chat()
    node.say(short.id, "When does the library open?")
    opening = "The library opens at nine and closes at five. " * 60
    long = node.service.new_chat(system_prompt=opening)
    node.say(long.id, "When does the library open?")
    assert len(node.engine.tokens) > 512
    # Past the window too: llama.cpp saves the window's KV, and the chat resumes at its end.
    assert node.kv.peek(node.kv.chat_key(long.id)) == node.engine.tokens

    node.kv.flush()
    later = Node(folder, gemma_path)
    # Both give the uninterrupted chat's reply (its kept KV, the same decodes).
    script = ["When does the library open?", "When does it close?"]
    short_ref = sitting(folder / "a", gemma_path, script)[-1]
    long_ref = sitting(folder / "b", gemma_path, script, system_prompt=opening)[-1]
    for chat, reference in ((short, short_ref), (long, long_ref)):
        restored = later.say(chat.id, "When does it close?")
        assert restored.stats.source == "disk"
        assert_only_new_tokens_evaluated(restored)
        assert restored.text == reference


def test_a_chat_deleted_while_it_answers_leaves_no_file(folder, model_path):
    node = Node(folder, model_path)
    chat = node.service.new_chat()
    stream = node.service.send(chat.id, "Write a long story about a dragon.")
    next(stream)
    node.service.delete_chat(chat.id)
    with pytest.raises(Exception, match=f"chat {chat.id} does not exist"):
        list(stream)
    assert [key for key in node.kv.files() if key.startswith(f"chat-{chat.id}-")] == []
    assert node.service.scheduler.busy == 0


@pytest.mark.slow
def test_a_message_typed_ahead_leaves_only_its_end_to_evaluate(folder, model_path):
    first = Node(folder, model_path)
    chat = first.service.new_chat()
    planet = first.say(chat.id, "Which planet do we live on?").text
    saved = kv_tokens(first.kv, chat.id)

    first.kv.flush()
    later = Node(folder, model_path)  # a restart; the page opens the chat, the user types
    service = later.service
    assert service.restore_ahead(chat.id)
    typed = 0
    message = ("What is the capital city of France? Answer in one word, and say nothing "
               "else: no sentence, no explanation.")
    for end in [*range(8, len(message), 8), len(message)]:  # a few keystrokes at a time
        typed += service.type_ahead(chat.id, message[:end])
    # The prompt of the message as typed, by the decodes its send makes: typing ahead never
    # changes the reply (test_reproducible), and the send evaluates nothing more.
    assert typed >= KEPT_CHUNK, "most of the message was evaluated while it was typed"
    assert service.type_ahead(chat.id, message) == 0, "nothing new: nothing evaluated"
    # The KV typed ahead is the KV of its tokens (to a batched evaluation's rounding).
    cold = Engine(model_path, n_ctx=2048, n_threads=THREADS)
    cold.prefill(list(later.engine.tokens))
    typed_logits, reference = later.engine.logits(), cold.logits()
    assert typed_logits.argmax() == reference.argmax()
    assert abs(typed_logits - reference).max() / abs(reference).max() < 0.1
    last = later.say(chat.id, message)
    assert last.stats.source == "disk", "the history still counts as restored from disk"
    assert last.stats.reused == len(saved) + last.stats.typed_ahead
    assert last.stats.typed_ahead >= KEPT_CHUNK
    assert last.stats.prefilled == 0, "the typed prompt's logits were live: nothing evaluated"
    assert last.stats.prefilled == last.stats.prompt_tokens - last.stats.reused
    assert_answers(last.text, model_answer("Which planet do we live on?", planet, message),
                   n=1)
    line = stats_text(last.stats)
    assert f"restored {len(saved):,} tokens from disk" in line
    assert f"{last.stats.typed_ahead} evaluated while typing" in line

    # A draft that changes its mind: the new text is what counts; the turn stays exact.
    service.type_ahead(chat.id, "What is the capital of Spain")
    again = later.say(chat.id, "What is the capital city of Italy? Answer in one word.")
    assert again.stats.prefilled == again.stats.prompt_tokens - again.stats.reused
    assert "Rome" in again.text
    # Busy model (another chat's reply being written): a draft never waits.
    other = service.new_chat()
    stream = service.send(other.id, "Write a long story about a dragon.")
    next(stream)
    assert service.type_ahead(chat.id, "Thank you") == 0
    stream.close()


@pytest.mark.slow
def test_the_cache_s_totals_and_prefill_speed_outlive_a_restart(folder, model_path,
                                                                  kv_blobs):
    node = Node(folder, model_path)
    chat = node.service.new_chat(system_prompt=LONG_SYSTEM)
    node.say(chat.id, "Which planet do we live on?")
    node.kv.flush()
    later = Node(folder, model_path)
    later.say(chat.id, "Say hello.")  # restored from disk
    before = later.service.cache_stats()
    assert before["prefill_tokens_per_s"] > 0 and before["tokens_restored"] > 0
    assert before["chats_ready"] == 1
    again = Node(folder, model_path).service.cache_stats()  # another restart, no turn yet
    for figure in ("prefill_tokens_per_s", "tokens_restored", "hits", "lookups",
                   "time_saved_s"):
        assert again[figure] == pytest.approx(before[figure], rel=0.01), figure
    assert again["chats_ready"] == 1
    later.service.delete_chat(chat.id)
    assert later.service.cache_stats()["chats_ready"] == 0
    # An unreadable file of totals is a fresh start, not a crash.
    kv_blobs.at(folder / "kv").put(TOTALS_NAME, [b"{not json"])
    assert Node(folder, model_path).service.cache_stats()["tokens_restored"] == 0


@pytest.mark.slow
def test_the_time_saved_is_counted_once_per_hit_and_only_grows(folder, model_path):
    """It was the tokens restored over today's prefill rate: as the rate's estimate rose, the
    sidebar's "time saved" fell (3 min, 2 min, 51 s). Each hit now adds its own seconds, at
    the rate measured then; a later, faster rate leaves them as they were."""
    node = Node(folder, model_path)
    chat = node.service.new_chat(system_prompt=LONG_SYSTEM)
    node.say(chat.id, "Which planet do we live on?")
    node.kv.flush()
    later = Node(folder, model_path)
    later.say(chat.id, "Say hello.")  # restored from disk: a hit
    saved = later.service.cache_stats()["time_saved_s"]
    assert saved > 0
    # The sidebar says it in time once there is half a second of it, never "≈ 0 s saved".
    from reame.web.page.settings_tab import cache_markdown

    line = cache_markdown(later.service)
    assert ("of recomputation saved" in line) == (saved >= 0.5), (saved, line)
    assert "≈ 0 s" not in line, line
    later.service.cache.prefill_rate *= 10  # the estimate moves (a faster prefill measured)
    assert later.service.cache_stats()["time_saved_s"] == saved
    later.kv.flush()
    third = Node(folder, model_path)  # a restart: the next turn restores from disk again
    third.say(chat.id, "And the moon?")
    assert third.service.cache_stats()["time_saved_s"] > saved


def test_the_chats_ready_are_counted_as_files_come_and_go(folder, kv_blobs):
    """KVStore.ready_chats: the chats with a file of the store's model, kept as files are
    written, evicted, deleted and swept, and found at start: always what looking for each
    chat's file says (the old way of counting them), without looking."""
    kv_dir = kv_blobs.at(folder / "kv")
    kv = KVStore(kv_dir, fingerprint="test", max_bytes=1 << 30)
    chats = set(range(1, 9))

    def check(store):
        looked = {chat for chat in chats if store.exists(store.chat_key(chat))}
        assert store.ready_chats() & chats == looked
        return len(looked)

    assert check(kv) == 0
    for chat in range(1, 7):
        kv.write(kv.chat_key(chat), list(range(chat)), bytes(1000))
    kv.write(kv.prefix_key("ab" * 12), list(range(64)), bytes(1000))  # not a chat's
    other = KVStore(kv_dir, fingerprint="another model", max_bytes=1 << 30)
    other.write(other.chat_key(7), [1, 2], bytes(1000))  # another model's: not ready
    assert check(kv) == 6 and check(other) == 1
    kv.write_later(kv.chat_key(8), [1, 2, 3], bytes(1000))
    kv.flush()
    assert check(kv) == 7
    for n, chat in enumerate([3, 1, 2, 4, 5, 6, 8]):  # oldest first, for the eviction
        Backend.set_used(kv.blobs, kv.chat_key(chat), 1000 + n)
    kv.max_bytes = 3 * kv.blobs.size(kv.chat_key(8))
    assert kv.evict() > 0
    assert check(kv) == len([key for key in kv.files() if key.startswith("chat-")
                             and key.endswith(f"-{kv.tag}.kv")]) < 7
    kv.max_bytes = 1 << 30
    kv.delete_chat(8)
    assert check(kv) == check(KVStore(kv_dir, fingerprint="test", max_bytes=1 << 30))
    kv.write(kv.chat_key(1), [1], bytes(1000))
    restarted = KVStore(kv_dir, fingerprint="test", max_bytes=1 << 30)  # found at start
    assert restarted.ready_chats() == kv.ready_chats() and check(restarted) >= 1
    assert restarted.sweep(set()) > 0
    assert check(restarted) == 0


def test_counting_the_chats_ready_after_a_reply_looks_for_no_chat_s_file(folder, model_path,
                                                                         monkeypatch):
    """The Cache panel after each reply (an administrator's: every chat of every user) counts
    the chats ready to continue from the running count: no file is looked for per chat."""
    import pathlib

    node = Node(folder, model_path)
    chats = [node.service.new_chat() for _ in range(30)]
    node.say(chats[0].id, "Say hello.")
    node.kv.flush()
    on_disk = {b.key for b in node.kv.blobs.list()}
    looked = []
    stat = pathlib.Path.stat
    monkeypatch.setattr(pathlib.Path, "stat",
                        lambda self, **kw: looked.append(self.name) or stat(self, **kw))
    stats = node.service.cache_stats()
    monkeypatch.undo()
    assert stats["chats_ready"] == 1
    assert set(looked) - {"kv"} <= on_disk, "only the folder and its files are looked at"
    node.service.delete_chat(chats[0].id)
    assert node.service.cache_stats()["chats_ready"] == 0


def test_an_opening_reused_from_memory_counts_as_one_restored_from_a_file(folder, model_path):
    """Whether a new chat finds the shared opening still live (another chat's turn left it) or
    in a file depends on what others did last: the figures count both alike, or a user's own
    counts would tell them what other users do (tests/whole/test_security.py)."""
    system = "You are a careful assistant. Answer briefly and politely. " * 8
    node = Node(folder, model_path)
    first = node.service.new_chat(system_prompt=system)
    node.say(first.id, "Which planet do we live on?")
    base = node.service.cache_stats()
    second = node.service.new_chat(system_prompt=system)
    from_memory = node.say(second.id, "Say hello.")
    assert from_memory.stats.source == "live" and from_memory.stats.reused >= 64
    memory = node.service.cache_stats()
    node.kv.flush()

    later = Node(folder, model_path)  # nothing live: the opening comes from a file
    base_later = later.service.cache_stats()
    third = later.service.new_chat(system_prompt=system)
    # (Not "Say hello." again: the second chat's file keeps that very prompt's logits, and
    # would give all of it; nor a message sharing its first word: one more token reused.)
    from_file = later.say(third.id, "Name a colour.")
    assert from_file.stats.source in ("prefix", "disk", "branch")
    assert from_file.stats.reused == from_memory.stats.reused
    files = later.service.cache_stats()
    assert ([memory[k] - base[k] for k in ("lookups", "hits", "tokens_restored")]
            == [files[k] - base_later[k] for k in ("lookups", "hits", "tokens_restored")]
            == [1, 1, from_memory.stats.reused])
