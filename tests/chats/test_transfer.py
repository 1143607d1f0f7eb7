"""Export and import of chats (reame/chats/transfer/): Reame's own documents round trip, ChatGPT's
export, the Markdown of a chat, and files that are not what they claim to be. No model here:
chats are built in a real SQLite store in a temp dir."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reame.chats.store import MessageTree, Store
from reame.chats.titles import DEFAULT_TITLE, MAX_TITLE
from reame.chats.transfer import (
    BadImport,
    ImportedChat,
    ImportedMessage,
    export_all,
    export_chat,
    parse_import,
    to_markdown,
)
from reame.chats.transfer import checks as transfer  # its limits and ChatGPT's flag
from reame.config.chat_settings import ChatSettings
from reame.config.refusals import ChatError

CHATGPT = Path(__file__).parents[1] / "data" / "chatgpt_conversations.json"
STATS = {"reused": 120, "source": "disk", "restore_ms": 3.5, "generated": 7,
         "tokens_per_s": 41.2, "window_recomputed": False, "stopped": True}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "chats.db")


def tree_chat(store: Store) -> int:
    """A chat with a retried reply and an edited message: versions on two levels.

    u1 -> a1, a1' (retry) ; a1' -> u2, u2' (edit) ; u2' -> a3 (stopped), the branch shown."""
    chat = store.create_chat(title="Pasta  night", system_prompt="You cook.\nBriefly.",
                             temperature=0.3, top_p=0.9, max_tokens=256, owner="ana")
    u1 = store.add_message(chat.id, "user", "How long do I boil spaghetti?", created_at=100.0)
    store.add_message(chat.id, "assistant", "About 10 minutes.", tokens=[1, 2, 3],
                      tokens_model="fp-model", stats={"generated": 3}, created_at=101.0)
    a1b = store.add_message(chat.id, "assistant", "9 to 11 minutes, taste it.", after=u1.id,
                            stats=STATS, created_at=102.0)
    store.add_message(chat.id, "user", "And penne?", created_at=103.0)
    store.add_message(chat.id, "user", "And *penne* <b>al dente</b>?", after=a1b.id,
                      created_at=104.0)
    store.add_message(chat.id, "assistant", "```python\nboil(penne, minutes=11", stopped=True,
                      created_at=105.0)
    return chat.id


def shape(tree: MessageTree) -> list[tuple]:
    """A tree without its ids: each message's parent as its place in the list."""
    place = {m.id: n for n, m in enumerate(tree.messages)}
    return [(place.get(m.parent_id), m.role, m.content, m.created_at, m.stopped,
             m.stats_dict or None) for m in tree.messages]


def current_place(tree: MessageTree) -> int | None:
    return next((n for n, m in enumerate(tree.messages) if m.id == tree.leaf_id), None)


def store_imported(store: Store, imported: ImportedChat, defaults: ChatSettings) -> int:
    """What an importer does with an ImportedChat: the chat, its messages in their order (each
    after its parent), then the branch shown."""
    settings = imported.settings_over(defaults)
    chat = store.create_chat(title=imported.title, **settings.as_dict())
    ids: dict[str, int] = {}
    for m in imported.messages:
        if m.parent is None:  # add_message(after=None) follows the branch shown
            store.update_chat(chat.id, leaf_id=None)
        ids[m.key] = store.add_message(
            chat.id, m.role, m.content, stats=m.stats, stopped=m.stopped,
            created_at=m.created_at, after=ids[m.parent] if m.parent is not None else None).id
    store.update_chat(chat.id, leaf_id=ids[imported.current] if imported.current else None)
    return chat.id


def through_json(doc: dict) -> object:
    """doc as a file holds it: strict JSON (no NaN or Infinity), read back."""
    return json.loads(json.dumps(doc, allow_nan=False))


# export


def test_export_chat_holds_every_version_and_no_tokens(store):
    chat_id = tree_chat(store)
    chat, tree = store.get_chat(chat_id), store.tree(chat_id)
    doc = export_chat(chat, tree)
    assert doc["format"] == "reame-chat" and doc["version"] == 1
    assert doc["title"] == "Pasta  night"
    assert doc["settings"] == {"system_prompt": "You cook.\nBriefly.", "temperature": 0.3,
                               "top_p": 0.9, "max_tokens": 256}
    assert doc["created_at"] == chat.created_at and doc["updated_at"] == chat.updated_at
    assert [m["id"] for m in doc["messages"]] == [m.id for m in tree.messages]
    assert doc["current"] == tree.leaf_id == doc["messages"][-1]["id"]
    first, reply = doc["messages"][0], doc["messages"][1]
    assert first == {"id": first["id"], "parent": None, "role": "user",
                     "content": "How long do I boil spaghetti?", "created_at": 100.0}
    assert reply["parent"] == first["id"] and reply["stopped"] is False
    assert reply["stats"] == {"generated": 3}
    assert doc["messages"][-1]["stopped"] is True and doc["messages"][-1]["stats"] is None
    assert all("tokens" not in m and "tokens_model" not in m for m in doc["messages"])
    written = json.dumps(doc, allow_nan=False)
    for private in ("fp-model", "[1, 2, 3]", "ana", "owner", "window_start", "branched_from"):
        assert private not in written


def test_export_of_an_empty_chat(store):
    chat = store.create_chat(title="Empty", system_prompt="", temperature=0.7, top_p=0.95,
                             max_tokens=512)
    doc = export_chat(chat, store.tree(chat.id))
    assert doc["messages"] == [] and doc["current"] is None
    [imported] = parse_import(through_json(doc))
    assert imported.messages == [] and imported.current is None


def test_export_all(store):
    first, second = tree_chat(store), tree_chat(store)
    store.update_chat(second, title="Second")
    doc = export_all([(store.get_chat(i), store.tree(i)) for i in (first, second)])
    assert doc["format"] == "reame-chats" and doc["version"] == 1
    assert isinstance(doc["exported_at"], float)
    assert [c["title"] for c in doc["chats"]] == ["Pasta  night", "Second"]
    assert doc["chats"][1] == export_chat(store.get_chat(second), store.tree(second))


# Reame's documents read back


def test_round_trip_gives_the_same_tree(store):
    chat_id = tree_chat(store)
    chat, tree = store.get_chat(chat_id), store.tree(chat_id)
    [imported] = parse_import(through_json(export_chat(chat, tree)))
    assert imported.title == "Pasta night"  # spaces tidied as a title is
    assert imported.created_at == chat.created_at
    assert imported.current == str(tree.leaf_id)
    assert [(m.key, m.parent) for m in imported.messages] == [
        (str(m.id), None if m.parent_id is None else str(m.parent_id)) for m in tree.messages]
    assert [(m.role, m.content, m.created_at, m.stopped) for m in imported.messages] == [
        (m.role, m.content, m.created_at, m.stopped) for m in tree.messages]
    assert imported.messages[2].stats == STATS
    assert imported.messages[0].stats is None and imported.messages[-1].stats is None


def test_round_trip_through_the_store(store):
    chat_id = tree_chat(store)
    original = store.tree(chat_id)
    doc = through_json(export_chat(store.get_chat(chat_id), original))
    [imported] = parse_import(doc)
    copy_id = store_imported(store, imported, ChatSettings())
    copied = store.tree(copy_id)
    assert shape(copied) == shape(original)
    assert current_place(copied) == current_place(original)
    assert [m.content for m in copied.branch] == [m.content for m in original.branch]
    assert [copied.version(m) for m in copied.branch] == [(1, 1), (2, 2), (2, 2), (1, 1)]
    assert all(m.tokens is None for m in copied.messages)  # built again at the first turn
    chat = store.get_chat(copy_id)
    assert (chat.system_prompt, chat.temperature, chat.top_p, chat.max_tokens) == (
        "You cook.\nBriefly.", 0.3, 0.9, 256)


def tool_chat(store: Store) -> int:
    """A chat whose reply called two tools, their results, and the answer to them."""
    chat = store.create_chat(title="Weather", system_prompt="", temperature=0, top_p=1,
                             max_tokens=64)
    store.add_message(chat.id, "user", "Weather in Paris and Rome?")
    calls = [{"id": "call_a0", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"id": "call_a1", "name": "get_weather", "arguments": '{"city": "Rome"}'}]
    store.add_message(chat.id, "assistant", "", tool_calls=calls, tokens=[5, 6],
                      tokens_model="fp-model")
    for call, sky in zip(calls, ("cloudy", "sunny")):
        store.add_message(chat.id, "tool", f'{{"sky": "{sky}"}}', tool_call_id=call["id"])
    store.add_message(chat.id, "assistant", "Cloudy in Paris, sunny in Rome.")
    return chat.id


def test_tool_calls_and_results_round_trip_and_older_files_still_import(store):
    chat_id = tool_chat(store)
    original = store.tree(chat_id)
    doc = through_json(export_chat(store.get_chat(chat_id), original))
    assert doc["messages"][1]["tool_calls"] == original.messages[1].call_list
    assert [m.get("tool_call_id") for m in doc["messages"]] == [
        None, None, "call_a0", "call_a1", None]
    [imported] = parse_import(doc)
    copy_id = store.create_chat(title=imported.title, system_prompt="", temperature=0,
                                top_p=1, max_tokens=64).id
    store.add_tree(copy_id, imported.messages, imported.current)  # as an import stores it
    copied = store.tree(copy_id)
    assert [(m.role, m.content, m.call_list, m.tool_call_id) for m in copied.branch] == [
        (m.role, m.content, m.call_list, m.tool_call_id) for m in original.branch]
    assert all(m.tokens is None for m in copied.messages)
    markdown = to_markdown(store.get_chat(chat_id), original)
    assert '*Called get_weather({"city": "Paris"})* (`call_a0`)' in markdown
    assert "**Tool result** (`call_a1`)" in markdown and "<tool_call>" not in markdown
    # A file of before tool calls (no such fields) imports as it always did.
    older = through_json(export_chat(*tree_chat_of(store)))
    for m in older["messages"]:
        assert "tool_calls" not in m and "tool_call_id" not in m
    assert all(m.tool_calls is None and m.tool_call_id is None
               for m in parse_import(older)[0].messages)


def tree_chat_of(store: Store):
    chat_id = tree_chat(store)
    return store.get_chat(chat_id), store.tree(chat_id)


def test_export_all_round_trip(store):
    ids = [tree_chat(store), store.create_chat(title="Empty", system_prompt="", temperature=1,
                                               top_p=1, max_tokens=9).id]
    doc = through_json(export_all([(store.get_chat(i), store.tree(i)) for i in ids]))
    imported = parse_import(doc)
    assert [c.title for c in imported] == ["Pasta night", "Empty"]
    for chat_id, chat in zip(ids, imported):
        copied = store.tree(store_imported(store, chat, ChatSettings()))
        assert shape(copied) == shape(store.tree(chat_id))
        assert current_place(copied) == current_place(store.tree(chat_id))
    assert imported[1].settings == {"system_prompt": "", "temperature": 1.0, "top_p": 1.0,
                                    "max_tokens": 9}


def test_siblings_keep_their_order_when_children_come_first():
    """A hand-made file may list a message before its parent: it is placed after it, and
    versions keep the file's order."""
    doc = {"format": "reame-chat", "version": 1, "title": "t", "current": "b2", "messages": [
        {"id": "b1", "parent": "a", "role": "assistant", "content": "first"},
        {"id": "b2", "parent": "a", "role": "assistant", "content": "second"},
        {"id": "a", "parent": None, "role": "user", "content": "q"},
        {"id": "b3", "parent": "a", "role": "assistant", "content": "third"},
    ]}
    [chat] = parse_import(doc)
    assert [m.key for m in chat.messages] == ["a", "b1", "b2", "b3"]
    assert chat.current == "b2"


def test_settings_are_checked_and_applied_over_defaults():
    doc = {"format": "reame-chat", "version": 1, "messages": [],
           "settings": {"temperature": 1, "max_tokens": 100.0, "top_p": None, "seed": 7}}
    [chat] = parse_import(doc)
    assert chat.title == DEFAULT_TITLE
    assert chat.settings == {"temperature": 1.0, "max_tokens": 100}
    defaults = ChatSettings(system_prompt="Default.", top_p=0.5)
    assert chat.settings_over(defaults) == ChatSettings("Default.", 1.0, 0.5, 100)
    made = ImportedChat("t", {"temperature": 9.0}, None, [], None)
    with pytest.raises(ChatError, match="temperature must be between 0 and 2"):
        made.settings_over(defaults)


def test_stats_this_server_does_not_know_are_left_out():
    doc = reame_doc(user("q"), {"id": "r", "parent": "q", "role": "assistant", "content": "a",
                                "stats": {"generated": 4.0, "from_a_later_version": [1]}})
    assert parse_import(doc)[0].messages[1].stats == {"generated": 4}
    doc["messages"][1]["stats"] = {"from_a_later_version": [1]}
    assert parse_import(doc)[0].messages[1].stats is None


def test_titles_are_made_safe():
    def title_of(title: object) -> str:
        return parse_import({"format": "reame-chat", "version": 1, "messages": [],
                             "title": title})[0].title

    assert title_of("  a \n title\t") == "a title"
    assert title_of("   ") == DEFAULT_TITLE
    assert title_of(None) == DEFAULT_TITLE
    long = title_of("word " * 100)
    assert len(long) == MAX_TITLE and long.endswith("…")


# ChatGPT's export


@pytest.fixture(scope="module")
def chatgpt() -> list[ImportedChat]:
    return parse_import(json.loads(CHATGPT.read_text()))


def test_chatgpt_conversations_are_read(chatgpt):
    assert [c.title for c in chatgpt] == ["Lisbon day trip", "Reversing a list in Python"]
    assert [c.created_at for c in chatgpt] == [1714561200.512, 1714557600.0]


def test_chatgpt_branches_are_kept_and_current_is_the_branch_shown(chatgpt):
    lisbon = chatgpt[0]
    by_key = {m.key: m for m in lisbon.messages}
    first = lisbon.messages[0]
    assert (first.role, first.content, first.parent) == (
        "user", "Plan a day in Lisbon for me.", None)  # the system nodes above it left out
    reply = lisbon.messages[1]
    versions = [m for m in lisbon.messages if m.parent == reply.key]
    assert [m.content for m in versions] == ["What about the evening?",
                                             "What about dinner near this square?"]
    assert all(m.role == "user" for m in versions)
    branch, at = [], lisbon.current
    while at is not None:
        branch.append(by_key[at])
        at = by_key[at].parent
    assert [m.content.split("\n")[0] for m in reversed(branch)] == [
        "Plan a day in Lisbon for me.", "- **Morning:** Belém Tower and a pastel de nata at "
        "Pastéis de Belém", "What about dinner near this square?",
        "That looks like Praça do Comércio. Nearby:"]
    assert branch[0].stopped is True  # ChatGPT's finish_details: interrupted
    assert [m.stopped for m in lisbon.messages].count(True) == 1
    assert all(m.stats is None for m in lisbon.messages)
    assert first.created_at == 1714561201.104


def test_chatgpt_system_prompt_is_the_first_visible_system_message(chatgpt):
    lisbon, python = chatgpt
    assert lisbon.settings == {"system_prompt": "You are a concise travel guide. Answer in "
                                                "short lists."}
    assert python.settings == {"system_prompt": ""}
    assert lisbon.settings_over(ChatSettings()).system_prompt.startswith("You are a concise")
    everything = " ".join(m.content for c in chatgpt for m in c.messages)
    for hidden in ("Model set context", "I live in Porto", "be brief"):
        assert hidden not in everything


def test_chatgpt_code_is_kept_and_tool_output_dropped(chatgpt):
    python = chatgpt[1]
    assert [m.role for m in python.messages] == ["user", "assistant", "assistant"]
    question, code, answer = python.messages
    assert code.content == "```\nxs = [1, 2, 3]\nprint(xs[::-1])\n```"
    assert code.parent == question.key and answer.parent == code.key  # the tool's node skipped
    assert "[3, 2, 1]\n" not in everything_of(python)
    assert python.current == answer.key


def everything_of(chat: ImportedChat) -> str:
    return "\n".join(m.content for m in chat.messages)


def test_chatgpt_multimodal_keeps_only_text_parts(chatgpt):
    texts = [m.content for m in chatgpt[0].messages]
    assert "What about dinner near this square?" in texts
    assert "asset_pointer" not in everything_of(chatgpt[0])


def test_chatgpt_one_conversation_alone_and_current_node_kinds():
    conversations = json.loads(CHATGPT.read_text())
    one = copy.deepcopy(conversations[1])
    [chat] = parse_import(one)
    assert chat.title == "Reversing a list in Python"
    one["current_node"] = "3e2d1c0b-9a8f-4e7d-b6c5-a4b3c2d1e0f1"  # the hidden system root
    assert parse_import(one)[0].current is None
    one["current_node"] = "8e9f0a1b-2c3d-4e5f-a6b7-c8d9e0f1a224"  # the tool's output
    assert parse_import(one)[0].current == "5d6e7f80-1a2b-4c3d-9e4f-5a6b7c8d9e13"
    del one["current_node"]
    assert parse_import(one)[0].current == "c9d0e1f2-3a4b-4c5d-8e6f-7a8b9c0d1e35"
    one["current_node"] = "gone"
    with pytest.raises(BadImport, match='"current_node" "gone" is not one of its nodes'):
        parse_import(one)


def test_chatgpt_code_fence_outlasts_the_code():
    conversation = {"title": "x", "mapping": {"n": {"parent": None, "message": {
        "author": {"role": "assistant"}, "content": {
            "content_type": "code", "language": "markdown", "text": "```\nquoted\n```"}}}}}
    [chat] = parse_import([conversation])
    assert chat.messages[0].content == "````markdown\n```\nquoted\n```\n````"


def test_imported_chatgpt_chats_store(store, chatgpt):
    for chat in chatgpt:
        tree = store.tree(store_imported(store, chat, ChatSettings()))
        assert len(tree.messages) == len(chat.messages)
        assert tree.branch[-1].content == next(
            m.content for m in chat.messages if m.key == chat.current)


# Markdown


def test_markdown_shows_the_branch_readably(store):
    chat_id = tree_chat(store)
    text = to_markdown(store.get_chat(chat_id), store.tree(chat_id))
    assert text.startswith("# Pasta night\n\n> **System prompt**\n>\n> You cook.\n> Briefly.\n")
    assert ("---\n\n**You**\n\nHow long do I boil spaghetti?\n\n"
            "---\n\n**Assistant** (version 2 of 2)\n\n9 to 11 minutes, taste it.\n\n"
            "---\n\n**You** (version 2 of 2)\n\nAnd *penne* <b>al dente</b>?\n\n"
            "---\n\n**Assistant** (stopped)\n\n```python\nboil(penne, minutes=11\n```\n"
            ) in text
    assert text.endswith("```\n")
    assert "About 10 minutes." not in text and "And penne?" not in text  # other versions


def test_markdown_without_system_prompt_or_messages(store):
    chat = store.create_chat(title="Quiet", system_prompt="  ", temperature=0.7, top_p=0.95,
                             max_tokens=512)
    assert to_markdown(chat, store.tree(chat.id)) == "# Quiet\n"


# files that are not what they claim to be


def reame_doc(*messages: dict, **fields) -> dict:
    return {"format": "reame-chat", "version": 1, "title": "t", "messages": list(messages),
            **fields}


def user(id_: object, parent: object = None, **fields) -> dict:
    return {"id": id_, "parent": parent, "role": "user", "content": "hi", **fields}


BAD = [
    ("a text", "not a Reame or ChatGPT export: the file holds a text"),
    (None, "not a Reame or ChatGPT export: the file holds null"),
    ({"hello": 1}, 'no "format"'),
    ({"format": "other"}, 'its format is "other"'),
    ({"format": "reame-chat"}, "does not say which version of the Reame export"),
    ({"format": "reame-chat", "version": 2}, "version 2 of the Reame export format; this "
                                             "server reads version 1"),
    ({"format": "reame-chat", "version": True}, "version true or false"),
    ({"format": "reame-chat", "version": 1}, 'a chat has its messages in a list, "messages"'),
    ({"format": "reame-chats", "version": 1, "chats": {}}, 'them in a list, "chats"'),
    ({"format": "reame-chats", "version": 1, "chats": [reame_doc(), 3]},
     "chat 2: a chat is a number, not a JSON object"),
    ({"format": "reame-chats", "version": 1, "chats": [
        reame_doc(), reame_doc(user(1, 99), title="Second")]},
     'chat 2 ("Second"): message 1 names parent 99, which is not in the chat'),
    (reame_doc(user(12, 99)), "message 12 names parent 99, which is not in the chat"),
    (reame_doc(user(1), user(1)), "two messages have the id 1"),
    (reame_doc(user(1), user("1")), 'two messages have the id "1"'),
    (reame_doc(user(1, 1)), "message 1 names itself as its parent"),
    (reame_doc(user(1), user(2, 3), user(3, 2)), "messages 2, 3 form a cycle"),
    (reame_doc(user(None)), "message 1 of the list has no id"),
    (reame_doc(user(1.5)), "message 1 of the list has no id"),
    (reame_doc(user(True)), "message 1 of the list has no id"),
    (reame_doc(user(1, [2])), "message 1: its parent a list is not a message id"),
    (reame_doc("hi"), "message 1 of the list is a text, not a JSON object"),
    (reame_doc(user(1, role="system")), 'message 1 has the role "system": a Reame chat has '
                                        "only user, assistant and tool messages"),
    (reame_doc(user("a"), user("b", "a", role="assistant", tool_calls={"id": "c"})),
     'message "b": its tool_calls are a JSON object, not a list'),
    (reame_doc(user("a"), user("b", "a", role="assistant", tool_calls=[
        {"id": "c", "name": "f"}])), 'message "b": tool call 1 has no arguments (a text)'),
    (reame_doc(user("a"), user("b", "a", role="assistant", tool_calls=[
        {"id": "c", "name": "f", "arguments": "[1]"}])),
     "tool call 1: its arguments are not the JSON text of an object"),
    (reame_doc(user("a"), user("b", "a", role="assistant", tool_calls=[
        {"id": "c", "name": "f", "arguments": "{}"}] * 2)), 'the id "c" is used twice'),
    (reame_doc(user("a", tool_calls=[{"id": "c", "name": "f", "arguments": "{}"}])),
     'message "a": only a reply has tool_calls'),
    (reame_doc(user("a"), user("b", "a", role="tool")),
     'message "b": a tool message, and only one, names the call it answers'),
    (reame_doc(user("a", tool_call_id="c")), "names the call it answers"),
    (reame_doc(user("a"), user("b", "a", role="tool", tool_call_id="c")),
     'message "b" answers the call "c", which the reply before it did not make'),
    (reame_doc(user(1, role=None)), "message 1 has the role null"),
    (reame_doc(user(1, content=None)), "message 1: its content is null, not a text"),
    (reame_doc(user(1, content=["hi"])), "message 1: its content is a list, not a text"),
    (reame_doc(user(1, created_at="today")), "created_at is a text, not a time"),
    (reame_doc(user(1, created_at=10**400)), "created_at is a number, not a time"),
    (reame_doc(user(1, stopped="yes")), "its stopped is a text, not true or false"),
    (reame_doc(user("a"), user("b", "a", role="assistant", stats=[1])),
     'message "b": its stats are a list, not a JSON object'),
    (reame_doc(user("a"), user("b", "a", role="assistant", stats={"generated": "7"})),
     'message "b": its stat generated is a text, not a whole number'),
    (reame_doc(user("a"), user("b", "a", role="assistant", stats={"generated": 7.5})),
     "its stat generated is a number, not a whole number"),
    (reame_doc(user(1), current=2), '"current" names message 2, which is not in the chat'),
    (reame_doc(user(1), current={"id": 1}), '"current" names message a JSON object'),
    (reame_doc(settings="warm"), "the settings are a text, not a JSON object"),
    (reame_doc(settings={"temperature": 3}), "settings: temperature must be between 0 and 2"),
    (reame_doc(settings={"top_p": 0}), "settings: top_p must be above 0 and at most 1"),
    (reame_doc(settings={"max_tokens": 10**400}), "settings: a number is far out of its range"),
    (reame_doc(settings={"max_tokens": "many"}), "settings: max_tokens must be a number"),
    (reame_doc(settings={"system_prompt": 5}), "settings: system_prompt must be a text"),
    (reame_doc(pinned="yes"), "the chat's pinned is a text, not true or false"),
    (reame_doc(archived=1), "the chat's archived is a number, not true or false"),
    (reame_doc(title=["t"]), "the title is a list, not a text"),
    (reame_doc(created_at=True), "the chat's created_at is true or false, not a time"),
    ({"format": "reame-chats", "version": 1, "chats": [{"format": "x", "messages": []}, {}]},
     'chat 1: a chat\'s format is "reame-chat", not "x"'),
    ([1], "a conversation is a number, not a JSON object"),
    ([{"title": "x"}], 'its messages in an object, "mapping"'),
    ([{"title": "A", "mapping": {}}, {"title": "B", "mapping": []}],
     'conversation 2 ("B"): a ChatGPT conversation has its messages in an object'),
    ([{"mapping": {"a": []}}], 'node "a" is a list, not a JSON object'),
    ([{"mapping": {"a": {"parent": 5}}}], 'node "a": its parent is a number, not a node id'),
    ([{"mapping": {"a": {"parent": "zz"}}}], 'node "a" names parent "zz", which is not in the '
                                             "conversation"),
    ([{"mapping": {"a": {"parent": "b"}, "b": {"parent": "a"}}}],
     'nodes "a", "b" form a cycle'),
    ([{"mapping": {"r": {"parent": None}}, "current_node": 3}],
     '"current_node" 3 is not one of its nodes'),
]


@pytest.mark.parametrize(("data", "says"), BAD, ids=[str(n) for n in range(len(BAD))])
def test_bad_files_say_what_is_wrong(data, says):
    with pytest.raises(BadImport) as raised:
        parse_import(data)
    assert says in str(raised.value)
    assert isinstance(raised.value, ChatError)


def test_limits(monkeypatch):
    monkeypatch.setattr(transfer, "MAX_MESSAGES_PER_CHAT", 2)
    monkeypatch.setattr(transfer, "MAX_CHATS", 2)
    with pytest.raises(BadImport, match="a chat holds at most 2 messages; this one has 3"):
        parse_import(reame_doc(user(1), user(2, 1), user(3, 2)))
    assert len(parse_import(reame_doc(user(1), user(2, 1))) [0].messages) == 2
    with pytest.raises(BadImport, match="an import holds at most 2 chats; this file has 3"):
        parse_import({"format": "reame-chats", "version": 1, "chats": [reame_doc()] * 3})
    with pytest.raises(BadImport, match="at most 2 chats"):
        parse_import([{"mapping": {}}] * 3)
    many = {str(n): {"parent": None, "message": {"author": {"role": "user"},
                                                 "content": {"parts": ["x"]}}}
            for n in range(3)}
    with pytest.raises(BadImport, match="at most 2 messages"):
        parse_import([{"mapping": many}])


def test_the_defaults_of_limits():
    assert (transfer.MAX_CHATS, transfer.MAX_MESSAGES_PER_CHAT) == (5000, 10000)


def test_empty_lists_are_no_chats():
    assert parse_import([]) == []
    assert parse_import({"format": "reame-chats", "version": 1, "chats": []}) == []


def test_a_long_chain_is_no_trouble():
    """No recursion: a chat as deep as the limit allows."""
    n = transfer.MAX_MESSAGES_PER_CHAT
    messages = [user(i, i - 1 if i else None) for i in range(n)]
    [chat] = parse_import(reame_doc(*reversed(messages), current=n - 1))
    assert [m.key for m in chat.messages] == [str(i) for i in range(n)]


# any shape: BadImport or chats, never another exception

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
IDS = st.integers(-1, 4) | st.sampled_from(["a", "b", "1", ""]) | st.none() | JSON
MESSAGE = st.fixed_dictionaries({}, optional={
    "id": IDS, "parent": IDS, "role": st.sampled_from(["user", "assistant", "tool"]) | JSON,
    "content": st.text(max_size=5) | JSON, "created_at": st.floats() | JSON,
    "stopped": st.booleans() | JSON,
    "stats": st.dictionaries(st.sampled_from(sorted(STATS)), JSON, max_size=3) | JSON})
REAME_CHAT = st.fixed_dictionaries({"messages": st.lists(MESSAGE, max_size=6) | JSON}, optional={
    "format": st.just("reame-chat") | JSON, "version": st.just(1) | JSON, "title": JSON,
    "created_at": JSON, "current": IDS,
    "settings": st.dictionaries(st.sampled_from(["system_prompt", "temperature", "top_p",
                                                 "max_tokens", "x"]), JSON) | JSON})
REAME = (REAME_CHAT.map(lambda d: {**d, "format": "reame-chat", "version": 1})
         | st.fixed_dictionaries({"format": st.just("reame-chats"), "version": st.just(1) | JSON,
                                  "chats": st.lists(REAME_CHAT, max_size=3) | JSON}))
NODE_IDS = st.sampled_from(["r", "a", "b", "c"])
CHATGPT_MESSAGE = st.fixed_dictionaries({}, optional={
    "author": st.fixed_dictionaries({"role": st.sampled_from(
        ["user", "assistant", "system", "tool"]) | JSON}) | JSON,
    "content": st.fixed_dictionaries({}, optional={
        "content_type": st.sampled_from(["text", "code", "multimodal_text"]) | JSON,
        "parts": st.lists(st.text(max_size=4) | JSON, max_size=3) | JSON,
        "text": st.text(max_size=4) | JSON, "language": JSON}) | JSON,
    "create_time": st.floats() | JSON,
    "metadata": st.fixed_dictionaries({}, optional={
        transfer.HIDDEN: st.booleans() | JSON,
        "finish_details": st.fixed_dictionaries({"type": st.just("interrupted") | JSON}) | JSON,
    }) | JSON})
CONVERSATION = st.fixed_dictionaries({"mapping": st.dictionaries(NODE_IDS, st.fixed_dictionaries(
    {}, optional={"parent": NODE_IDS | st.none() | JSON, "message": CHATGPT_MESSAGE | JSON,
                  "children": JSON})) | JSON}, optional={
    "title": JSON, "create_time": JSON, "current_node": NODE_IDS | JSON})
ANYTHING = JSON | REAME | st.lists(CONVERSATION, max_size=3) | CONVERSATION


def assert_sound(chats: list[ImportedChat]) -> None:
    """What a caller may rely on in chats parse_import returned."""
    for chat in chats:
        assert isinstance(chat.title, str) and 0 < len(chat.title) <= MAX_TITLE
        chat.settings_over(ChatSettings())  # checked already: never raises
        assert chat.created_at is None or isinstance(chat.created_at, float)
        seen: set[str] = set()
        for m in chat.messages:
            assert isinstance(m, ImportedMessage) and isinstance(m.key, str)
            assert m.key not in seen and (m.parent is None or m.parent in seen)
            assert m.role in ("user", "assistant") and isinstance(m.content, str)
            assert isinstance(m.stopped, bool)
            assert m.created_at is None or isinstance(m.created_at, float)
            assert m.stats is None or isinstance(m.stats, dict)
            seen.add(m.key)
        assert chat.current is None or chat.current in seen
        json.dumps([m.stats for m in chat.messages], allow_nan=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANYTHING)
def test_any_shape_gives_chats_or_bad_import(data):
    assert_chats_or_bad_import(data)


def assert_chats_or_bad_import(data: object) -> None:
    """Importing data gives sound chats, or BadImport saying something."""
    try:
        chats = parse_import(data)
    except BadImport as e:
        assert str(e)
    else:
        assert_sound(chats)


def paths(value: object, at: tuple = ()) -> list[tuple]:
    """Every place in a JSON value (as a tuple of keys and indexes)."""
    found = [at]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, at + (key,))
    elif isinstance(value, list):
        for n, inner in enumerate(value):
            found += paths(inner, at + (n,))
    return found


def replaced(value: object, at: tuple, new: object) -> object:
    if not at:
        return new
    value = copy.copy(value)
    value[at[0]] = replaced(value[at[0]], at[1:], new)
    return value


def valid_files() -> list[object]:
    messages = [user(1), {"id": 2, "parent": 1, "role": "assistant", "content": "yo",
                          "created_at": 5.0, "stopped": False, "stats": {"generated": 2}},
                user(3, 2), user(4, 2)]
    reame = {"format": "reame-chats", "version": 1, "exported_at": 1.0, "chats": [
        reame_doc(*messages, current=4, settings={"temperature": 0.5}, created_at=1.0)]}
    return [reame, json.loads(CHATGPT.read_text())]


VALID = valid_files()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_valid_file_changed_anywhere_gives_chats_or_bad_import(data):
    file = data.draw(st.sampled_from(VALID))
    at = data.draw(st.sampled_from(paths(file)))
    assert_chats_or_bad_import(replaced(file, at, data.draw(JSON)))
