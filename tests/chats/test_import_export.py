"""Export and import through the service and the named API, with the real model: an exported
chat comes back whole (versions included) and continues; a ChatGPT export becomes chats that
continue, their KV built on their first turn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reame.chats.transfer import BadImport

from tests.inference.test_cache import Node

CHATGPT = Path(__file__).parents[1] / "data" / "chatgpt_conversations.json"


@pytest.fixture
def node(tmp_path, model_path):
    return Node(tmp_path, model_path)


def tree(service, chat_id, user=None):
    _, whole = service.tree(chat_id, user)
    keys = {m.id: n for n, m in enumerate(whole.messages)}
    return ([(m.role, m.content, keys.get(m.parent_id)) for m in whole.messages],
            keys[whole.leaf_id])


def test_an_exported_chat_imports_whole_for_another_user_and_continues(node):
    service = node.service
    chat = service.new_chat(user="alice")
    node.finish(service.send(chat.id, "Which planet do we live on?", user="alice"))
    node.finish(service.regenerate(chat.id, user="alice"))  # two versions of the reply
    service.update_settings(chat.id, system_prompt="Answer briefly.", user="alice")
    exported = service.export_file(chat.id, "alice")
    assert exported["name"].endswith(".json")
    document = json.loads(exported["text"])
    assert document["format"] == "reame-chat" and len(document["messages"]) == 3
    assert all("tokens" not in m for m in document["messages"]), "no model-specific tokens"

    [copy] = service.import_chats(exported["text"], "bob")
    assert copy.owner == "bob" and copy.system_prompt == "Answer briefly."
    assert tree(service, copy.id, "bob") == tree(service, chat.id, "alice")
    # It continues: the first turn builds its KV from the text (no file of alice's is read),
    # the next reuses it.
    first = node.finish(service.send(copy.id, "And its moon?", user="bob"))
    assert first.stats.source == "none" and first.stats.reused == 0
    second = node.finish(service.send(copy.id, "Thanks!", user="bob"))
    assert second.stats.source == "live" and second.stats.reused >= first.stats.prompt_tokens


def test_a_pinned_and_an_archived_chat_come_back_pinned_and_archived(node):
    """Export all, then import: each chat keeps its place, pinned at the top or archived out
    of the list (still found by search); the others stay neither."""
    service = node.service
    pinned, archived, plain = (service.new_chat(title, user="alice")
                               for title in ("Pinned one", "Archived one", "Plain one"))
    service.toggle_pin(pinned.id, "alice")
    service.toggle_archive(archived.id, "alice")
    exported = service.export_file(None, "alice")
    made = {c.title: c for c in service.import_chats(exported["text"], "bob")}
    assert {t: (c.pinned, c.archived) for t, c in made.items()} == {
        "Pinned one": (True, False), "Archived one": (False, True), "Plain one": (False, False)}
    assert {c.title for c in service.list_chats("bob", archived=False)} == {
        "Pinned one", "Plain one"}
    assert [f.chat.title for f in service.search("Archived", "bob")] == ["Archived one"]


def test_a_chatgpt_export_becomes_chats_that_continue(node):
    service = node.service
    made = service.import_chats(CHATGPT.read_bytes())
    conversations = json.loads(CHATGPT.read_text())
    assert sorted(c.title for c in made) == sorted(c["title"] for c in conversations)
    for chat in made:
        messages = service.messages(chat.id)
        assert messages and {m.role for m in messages} <= {"user", "assistant"}
    chat = made[0]
    before = len(service.messages(chat.id))
    turn = node.finish(service.send(chat.id, "Thank you, that helps."))
    assert turn.text and len(service.messages(chat.id)) == before + 2
    markdown = service.export_file(chat.id, markdown=True)
    assert markdown["name"].endswith(".md") and markdown["text"].startswith(f"# {chat.title}")


def test_a_bad_file_imports_nothing_and_says_why(node):
    service = node.service
    before = service.list_chats()
    for data, says in ((b"\xff\xfe not json", "not JSON"), ("[1, 2]", "conversation 1"),
                       ('{"a": 1}', "not a Reame"),
                       (json.dumps({"format": "reame-chat", "version": 1, "title": "x",
                                    "messages": [{"id": 1, "parent": 9, "role": "user",
                                                  "content": "hi"}]}), "parent")):
        with pytest.raises(BadImport, match=says):
            service.import_chats(data)
    assert service.list_chats() == before


@pytest.mark.slow
def test_export_search_and_import_through_the_api(server_factory):
    from tests.browser_helpers import api

    server = server_factory(max_tokens=16)
    client = api(server)
    chat_id = client.predict("", None, api_name="/new_chat")
    client.predict(chat_id, "Tell me about Kilimanjaro.", api_name="/send")
    found = client.predict("kilima", api_name="/search_chats")
    assert [c["id"] for c in found] == [chat_id]
    assert re.search(r"\[\[Kilima\w*\]\]", found[0]["snippet"]), found  # the newest match
    assert client.predict(chat_id, api_name="/pin_chat")["pinned"] is True

    text = client.predict(chat_id, "json", api_name="/export_chat")
    assert json.loads(text)["messages"][0]["content"] == "Tell me about Kilimanjaro."
    markdown = client.predict(chat_id, "markdown", api_name="/export_chat")
    assert "Kilimanjaro" in markdown
    everything = json.loads(client.predict(api_name="/export_chats"))
    assert everything["format"] == "reame-chats" and len(everything["chats"]) == 1

    [copy] = client.predict(text, api_name="/import_chats")
    assert copy != chat_id
    assert client.predict(copy, api_name="/get_chat")["messages"][0]["content"] == (
        "Tell me about Kilimanjaro.")
    assert len(client.predict(api_name="/list_chats")) == 2
    with pytest.raises(Exception, match="not JSON"):
        client.predict("{", api_name="/import_chats")
    with pytest.raises(Exception, match='format must be "json" or "markdown"'):
        client.predict(chat_id, "pdf", api_name="/export_chat")
