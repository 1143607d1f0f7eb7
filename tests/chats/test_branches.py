"""Versions and branches with the real model: an edit or a retry keeps what it replaces, and a
branch reuses the KV of the chat it came from."""

from __future__ import annotations

import threading
import time

import pytest

from reame.chats.service import ChatError
from reame.chats.window import turns_of
from reame.config.refusals import ChatNotFound
from reame.web.page.render import stats_text

from tests.inference.test_cache import Node


def roles_and_texts(messages):
    return [(m.role, m.content) for m in messages]


@pytest.fixture
def node(tmp_path, model_path):
    return Node(tmp_path, model_path)


def test_a_retry_keeps_the_old_reply_as_a_version(node):
    service = node.service
    chat = service.new_chat()
    service.update_settings(chat.id, temperature=1.0)
    first = node.finish(service.send(chat.id, "Tell me a short story about a cat.", seed=1))
    second = node.finish(service.regenerate(chat.id, seed=2))
    assert first.text != second.text, "two seeds, two stories"
    _, tree = service.tree(chat.id)
    reply = tree.branch[-1]
    assert reply.content == second.text and (reply.version, reply.versions) == (2, 2)
    old = next(m for m in tree.messages if m.id == reply.version_ids[0])
    assert old.content == first.text, "the first reply is kept"
    shown = service.show_version(chat.id, old.id)
    assert shown[-1].content == first.text
    # The next message follows the version shown.
    node.finish(service.send(chat.id, "Thanks.", seed=3))
    assert [m.content for m in service.messages(chat.id)][:2] == [
        "Tell me a short story about a cat.", first.text]


@pytest.mark.slow
def test_a_retry_stopped_before_its_reply_began_shows_the_reply_it_was_to_replace(
        node, tmp_path, model_path):
    """A retry stopped while it still reads the chat is not made: the chat shows the reply it
    was to replace again, not its question alone (the page showed the question with no
    reply after an Esc: seen once in CI)."""
    service = node.service
    chat = service.new_chat()
    service.update_settings(chat.id, max_tokens=4)
    node.finish(service.send(chat.id, "Which of these words is a colour? " + " ".join(
        ["table", "river", "green", "cloud"] * 150)))
    before = service.messages(chat.id)
    # After a restart, with no KV file: the retry reads the whole chat, hundreds of tokens.
    later = Node(tmp_path, model_path, enabled=False)
    retry = later.service.regenerate(chat.id)
    consumer = threading.Thread(target=lambda: list(retry), daemon=True)
    consumer.start()
    deadline = time.monotonic() + 30
    while later.store.get_chat(chat.id).leaf_id != before[0].id:  # the retry's first write
        assert time.monotonic() < deadline and consumer.is_alive(), "the retry never began"
        time.sleep(0.002)
    retry.cancel()  # what the page's Stop does
    consumer.join(timeout=60)
    assert not consumer.is_alive()
    evaluated = later.engine.evaluated  # where the Stop came, for a failure's message
    assert [m.id for m in later.service.messages(chat.id)] == [m.id for m in before], evaluated
    _, tree = later.service.tree(chat.id)
    assert len(tree.messages) == 2, "no version was made"
    assert later.service.scheduler.busy == 0
    # A retry that does run is a new version as usual.
    again = later.finish(later.service.regenerate(chat.id))
    retried = later.service.messages(chat.id)[-1]
    assert (retried.version, retried.versions) == (2, 2), again


def chat_of(node, *messages):
    """A new chat of node's service, with a reply to each message."""
    chat = node.service.new_chat()
    for text in messages:
        node.say(chat.id, text)
    return chat


def test_an_edit_keeps_the_later_turns_in_the_old_version(node):
    service = node.service
    chat = chat_of(node, "Which planet do we live on?", "Say hello.", "Thank you!")
    before = service.messages(chat.id)
    node.finish(service.edit_message(chat.id, before[2].id, "Say goodbye."))
    after = service.messages(chat.id)
    assert len(after) == 4 and after[2].content == "Say goodbye."
    assert roles_and_texts(service.show_version(chat.id, before[2].id)) == roles_and_texts(
        before), "the old version comes back whole, its later turns included"
    _, tree = service.tree(chat.id)
    assert (tree.branch[2].version, tree.branch[2].versions) == (1, 2)


@pytest.mark.slow
def test_a_branch_restores_the_shared_history_from_its_parent_file(node, tmp_path,
                                                                     model_path):
    service = node.service
    chat = chat_of(node, "Which planet do we live on?", "Name a large ocean on it.",
                   "Thank you!")
    messages = service.store.messages(chat.id)  # the rows, with their tokens
    node.kv.flush()
    branch = service.branch(chat.id, messages[3].id)
    assert branch.title.endswith("(branch)") and branch.id != chat.id
    assert roles_and_texts(service.messages(branch.id)) == roles_and_texts(messages[:4])
    later = Node(tmp_path, model_path)  # after a restart: nothing live
    turn = later.finish(later.service.send(branch.id, "And a small sea?"))
    shared = len(later.service.prompts.tokens(
        chat.system_prompt, turns_of(messages[:4], later.engine.fingerprint)))
    assert turn.stats.source == "branch", turn.stats
    assert turn.stats.reused >= shared - 64, "the history they share is not recomputed"
    assert turn.stats.prefilled == turn.stats.prompt_tokens - turn.stats.reused
    assert "from the chat it branched from" in stats_text(turn.stats)
    # The parent is unchanged, and the same reply comes from a chat with no KV at all.
    assert roles_and_texts(service.messages(chat.id)) == roles_and_texts(messages)
    cold = Node(tmp_path / "cold", model_path, enabled=False)
    twin = cold.service.new_chat()
    cold.store.copy_messages(twin.id, messages[:4])
    assert cold.finish(cold.service.send(twin.id, "And a small sea?")).text == turn.text


def test_versions_branches_search_and_exports_are_the_owners_alone(node):
    service = node.service
    chat = service.new_chat(user="alice")
    node.finish(service.send(chat.id, "Hello from Zanzibar!", user="alice"))
    message = service.messages(chat.id, "alice")[0]
    for call in (lambda: service.branch(chat.id, message.id, "bob"),
                 lambda: service.show_version(chat.id, message.id, "bob"),
                 lambda: service.tree(chat.id, "bob"),
                 lambda: service.toggle_pin(chat.id, "bob"),
                 lambda: service.export_file(chat.id, "bob")):
        with pytest.raises(ChatNotFound):
            call()
    assert [f.chat.id for f in service.search("zanzibar", "alice")] == [chat.id]
    assert service.search("zanzibar", "bob") == [] and service.search("zanzibar") == []
    assert "Zanzibar" not in service.export_file(None, "bob")["text"]
    other = service.new_chat(user="alice")
    with pytest.raises(ChatError, match="not in"):
        service.show_version(other.id, message.id, "alice")
    with pytest.raises(ChatError, match="not in"):
        service.branch(other.id, message.id, "alice")
