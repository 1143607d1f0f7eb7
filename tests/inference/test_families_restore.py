"""Every model family keeps its chats: a chat continued after a restart restores its KV,
whatever the model's memory (kv_memory.py): a hybrid's recurrent state (the tiny LFM2,
Qwen3.5 and Granite 4.0-H shapes, tests/tiny_models.py), Gemma 3's sliding window past its
512 tokens.

Each conversation is compared with the same conversation uninterrupted (no restart): the
restored turn must sample from the very logits that one does (llama.cpp's state comes back
exactly, and the same decodes follow), and give the same greedy reply. The tiny models'
words are noise; their memory is the real architectures'.
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest

from reame.config.reame_conf import GenerationConfig
from reame.inference.engine import Engine
from reame.inference.kv import kvfile
from reame.inference.kv.blobs import FolderBlobs
from reame.inference.kv.kvstore import REPLIES_NAME
from reame.inference.prompt import PromptMessage
from reame.runtime import service_over
from reame.web.page.render import stats_words
from tests.conftest import FULL, SYSTEM_PROMPT, THREADS, start_server
from tests.kv_blobs import kv_blobs  # noqa: F401  (the fixture)

FAMILIES = ("lfm2", "qwen35", "granitehybrid", "gemma")
SIZES = (250, 1400)  # tokens of the third turn's prompt, about
# Gemma 3's long chat under `make test`: about 700 tokens are past its 512-token window all
# the same (its file keeps only the last 512 positions of the window's layers, llama.cpp
# saving no masked cell, and it cannot be cut back there), at about half the time of 1400,
# which `make test-full` runs.
GEMMA_LONG = 1400 if FULL else 700


def sizes(family: str, wanted=SIZES) -> list[int]:
    return [GEMMA_LONG if family == "gemma" and size == SIZES[-1] else size for size in wanted]


# Over HTTP each case starts four server processes: `make test` runs the long chat of each
# family there (the short one in process, below); `make test-full` both.
V1_CASES = [(family, size) for family in FAMILIES
            for size in sizes(family, SIZES if FULL else SIZES[-1:])]
# In process every family at both sizes, but Gemma 3's short chat (inside its 512-token window
# it restores as a dense model does; tests/inference/test_cache.py's Gemma test covers it) in test-full.
STORED = [(family, size) for family in FAMILIES for size in sizes(family)
          if FULL or (family, size) != ("gemma", 250)]
MAX_TOKENS = 12
# A message of about 28 tokens (SmolLM2's tokenizer; Gemma's makes it about as long).
TEXT = ("The library keeps old maps of the river valley, letters from the mill owners, "
        "and photographs of the bridge before the flood of that year. ")
GREEDY = GenerationConfig(system_prompt=SYSTEM_PROMPT, temperature=0.0, top_p=1.0,
                          max_tokens=MAX_TOKENS)


def model_of(request, family: str):
    return request.getfixturevalue(f"{family}_path")


def messages(size: int) -> list[str]:
    """Three user messages: the third turn's prompt is about size tokens."""
    n = max(2, (size - 80) // 28)
    return [TEXT * (n // 2) + "Summarize.", TEXT * (n - n // 2) + "And now?", "Say hello."]


# over HTTP: a stateless /v1 conversation


def ask(server, model: str, history: list[dict]) -> tuple[str, dict, dict]:
    body = {"model": model, "messages": history, "temperature": 0, "max_tokens": MAX_TOKENS}
    request = urllib.request.Request(server.url + "v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    return answer["choices"][0]["message"]["content"], answer["usage"], answer["reame"]


def conversation(server, model: str, texts: list[str], restart_before: int | None = None):
    """The turns' (reply, usage, figures), the server restarted before turn restart_before."""
    history, turns = [], []
    for n, text in enumerate(texts):
        if n == restart_before:
            server.restart()
        history.append({"role": "user", "content": text})
        reply, usage, figures = ask(server, model, history)
        history.append({"role": "assistant", "content": reply})
        turns.append((reply, usage, figures))
    return turns, history


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("family", "size"), V1_CASES)
def test_a_v1_conversation_continues_after_a_restart_as_if_uninterrupted(
        tmp_path, request, family, size):
    path = model_of(request, family)
    config = {"model_path": path, "max_tokens": MAX_TOKENS, "slots": 1, "n_ctx": 2048}
    texts = messages(size)
    reference = start_server(tmp_path / "reference", **config)
    try:
        uninterrupted, _ = conversation(reference, path.name, texts)
    finally:
        reference.stop()
    server = start_server(tmp_path / "restarted", **config)
    try:
        turns, history = conversation(server, path.name, texts, restart_before=2)
        reply, usage, figures = turns[2]
        prompt = usage["prompt_tokens"]
        assert prompt >= 0.8 * size
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert figures["source"] == "prefix", "found on disk by its tokens"
        assert cached >= 0.95 * prompt, f"{cached} of {prompt} reused after the restart"
        assert figures["prefilled"] == prompt - cached
        # The uninterrupted conversation's logits, bit for bit, and its reply.
        assert figures["first_logits"] == uninterrupted[2][2]["first_logits"]
        assert reply == uninterrupted[2][0]

        # The same request again after another restart (a regenerate): nothing evaluated.
        server.restart()
        again, usage, figures = ask(server, path.name, history[:-1])
        assert figures["prefilled"] == 0
        assert usage["prompt_tokens_details"]["cached_tokens"] == prompt
        assert figures["first_logits"] == uninterrupted[2][2]["first_logits"]
        assert again == reply
    finally:
        server.stop()


# in process: a stored chat, as the page and the named API run it


class Node:
    """One 'process': an engine with an empty context and a service over folder (also
    tests/inference/test_families_paths.py's, with its own settings)."""

    def __init__(self, folder, path, *, cache: bool = True, n_ctx: int = 2048,
                 settings: GenerationConfig = GREEDY):
        self.engine = Engine(path, n_ctx=n_ctx, n_threads=THREADS)
        self.service = service_over(folder, self.engine, settings, cache=cache)
        self.store = self.service.store

    def finish(self, updates):
        before = self.engine.evaluated
        last = list(updates)[-1]
        assert last.done
        last.evaluated = self.engine.evaluated - before
        return last

    def say(self, chat_id, text):
        return self.finish(self.service.send(chat_id, text))

    def flush(self):
        if self.service.cache.enabled:
            self.service.cache.flush()


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("kv_blobs")  # the folder's blobs, or the in-memory ones
@pytest.mark.parametrize(("family", "size"), STORED)
def test_a_stored_chat_continues_regenerates_and_edits_after_a_restart(
        tmp_path, request, family, size):
    path = model_of(request, family)
    texts = messages(size)
    sitting = Node(tmp_path / "reference", path, cache=False)  # one uninterrupted sitting
    chat = sitting.service.new_chat()
    reference = [sitting.say(chat.id, text) for text in texts]
    again_reference = sitting.finish(sitting.service.regenerate(chat.id))
    del sitting

    node = Node(tmp_path, path)
    chat = node.service.new_chat()
    for text in texts[:2]:
        node.say(chat.id, text)
    node.flush()
    later = Node(tmp_path, path)  # a restart
    third = later.say(chat.id, texts[2])
    s = third.stats
    assert s.prompt_tokens >= 0.8 * size
    assert s.source == "disk" and s.reused >= 0.95 * s.prompt_tokens, (s.reused, s.prompt_tokens)
    assert s.prefilled == s.prompt_tokens - s.reused
    assert s.first_logits == reference[2].stats.first_logits
    assert third.text == reference[2].text

    later.flush()
    again = Node(tmp_path, path)  # another restart, then a regenerate
    regenerated = again.finish(again.service.regenerate(chat.id))
    assert regenerated.stats.source == "disk" and regenerated.stats.prefilled == 0
    assert regenerated.stats.reused == regenerated.stats.prompt_tokens
    assert regenerated.stats.first_logits == reference[2].stats.first_logits
    assert regenerated.text == again_reference.text == third.text  # greedy

    # An edit of the last message resumes where its turn did (a mark), not from scratch.
    again.flush()
    edit = Node(tmp_path, path)
    last_user = [m for m in edit.service.store.messages(chat.id) if m.role == "user"][-1]
    edited = edit.finish(edit.service.edit_message(chat.id, last_user.id, "Say goodbye."))
    assert edited.stats.source == "disk"
    assert edited.stats.reused >= s.reused, (edited.stats.reused, s.reused)
    assert edited.stats.prefilled == edited.stats.prompt_tokens - edited.stats.reused
    # The file held the history and the edited message's opening (its role's template
    # tokens): a memory that cannot be cut back went back to the checkpoint at the turn's end
    # and says how much it read again; the page's stats line words it.
    print(f"\nedit: reused {edited.stats.reused}, read again {edited.stats.read_again}")
    assert 0 < edited.stats.read_again < 40, edited.stats.read_again
    assert "read again" in stats_words(edited.stats)


# what must never happen: a damaged file used, another user's KV reused


def stateless(node, history: list[str], replies: list[str], user: str | None = None):
    turns = []
    for n, text in enumerate(history):
        turns.append(PromptMessage("user", text))
        if n < len(replies):
            turns.append(PromptMessage("assistant", replies[n]))
    return node.finish(node.service.complete("", turns, temperature=0.0, max_tokens=MAX_TOKENS,
                                             user=user))


def damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[12:16], "little")
    header = json.loads(data[16:16 + length])
    assert header["marks"], "the file keeps marks"
    if how == "mark state":  # a byte of the first mark's state: the checksum tells
        at = 16 + length + 4 * header["n_tokens"] + header["state_bytes"]
        data[at + header["marks"][0][1] // 2] ^= 0x40
    elif how == "truncated":
        del data[len(data) - header["marks"][-1][2] // 2:]
    else:  # a mark where no decode ended: the header is refused before anything is loaded
        header["marks"][0][0] += 1
        raw = json.dumps(header).encode()
        data[12:16 + length] = len(raw).to_bytes(4, "little") + raw
    path.write_bytes(bytes(data))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["mark state", "truncated", "mark off a batch end"])
def test_a_damaged_file_is_as_good_as_no_file(tmp_path, lfm2_path, how):
    texts = messages(250)
    node = Node(tmp_path / "node", lfm2_path)
    replies = [stateless(node, texts[:1], []).text]
    replies.append(stateless(node, texts[:2], replies).text)
    node.flush()
    kv = tmp_path / "node" / "kv"
    newest = max(kv.glob("prefix-*.kv"), key=lambda p: p.stat().st_mtime)  # the next turn's
    # The references: the same folder without that file (the conversation's older file
    # stays), and without any KV file; both keep the replies' exact tokens (kept for
    # stateless clients beside the files).
    shutil.copytree(kv, tmp_path / "without" / "kv")
    (tmp_path / "without" / "kv" / newest.name).unlink()
    (tmp_path / "cold" / "kv").mkdir(parents=True)
    shutil.copy(kv / REPLIES_NAME, tmp_path / "cold" / "kv" / REPLIES_NAME)
    damage(newest, how)
    later = Node(tmp_path / "node", lfm2_path)
    third = stateless(later, texts, replies)
    assert kvfile.problem(FolderBlobs(kv), newest.name) is not None
    # (A header that makes no sense keeps the file out of the index: it is not even read.)
    assert later.service.cache.files.counters.rejected >= (how != "mark off a batch end")
    # A lookup that found the damaged file's head good goes no further (no other file could
    # give as much): then it is a cold start. The reply is the one the other files give.
    reference = stateless(Node(tmp_path / ("without" if third.stats.reused else "cold"),
                               lfm2_path), texts, replies)
    assert third.stats.reused == reference.stats.reused < 0.6 * third.stats.prompt_tokens
    assert third.stats.first_logits == reference.stats.first_logits
    assert third.text == reference.text


@pytest.mark.timeout(300)
def test_a_users_kept_state_and_logits_serve_that_user_only(tmp_path, qwen35_path):
    texts = messages(250)
    node = Node(tmp_path, qwen35_path)
    replies = [stateless(node, texts[:1], [], "alice").text]
    replies.append(stateless(node, texts[:2], replies, "alice").text)
    node.flush()
    later = Node(tmp_path, qwen35_path)
    bob = stateless(later, texts, replies, "bob")  # alice's very conversation, sent by bob
    assert bob.stats.reused == 0 and bob.stats.prefilled == bob.stats.prompt_tokens
    later.flush()
    again = Node(tmp_path, qwen35_path)
    alice = stateless(again, texts, replies, "alice")
    assert alice.stats.reused >= 0.95 * alice.stats.prompt_tokens
    again.flush()
    last = Node(tmp_path, qwen35_path)
    # The same request again: alice's file keeps the logits of its end, for her only.
    assert stateless(last, texts, replies, "alice").stats.prefilled == 0
    assert stateless(last, texts, replies, "carol").stats.reused == 0
