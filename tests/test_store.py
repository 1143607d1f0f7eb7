import sqlite3

import pytest

from reame.store import MIGRATIONS, ChatNotFound, Store


def new_chat(store, title="t"):
    return store.create_chat(title=title, system_prompt="s", temperature=0.5, top_p=0.9,
                             max_tokens=10)


def test_database_uses_wal_and_records_migrations(tmp_path):
    store = Store(tmp_path / "db" / "reame.db")
    new_chat(store)
    conn = sqlite3.connect(tmp_path / "db" / "reame.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    names = [row[0] for row in conn.execute("SELECT name FROM migrations")]
    assert names == [name for name, _ in MIGRATIONS]


def test_migrations_run_once(tmp_path):
    Store(tmp_path / "reame.db")
    again = Store(tmp_path / "reame.db")
    with again.engine.connect() as conn:
        from sqlalchemy import text
        assert conn.execute(text("SELECT count(*) FROM migrations")).scalar() == len(MIGRATIONS)


def test_a_database_from_before_the_window_column_is_upgraded(tmp_path):
    path = tmp_path / "reame.db"
    chat = new_chat(Store(path))
    conn = sqlite3.connect(path)  # make it look like a database of the first release
    conn.execute("ALTER TABLE chat DROP COLUMN window_start")
    conn.execute("DELETE FROM migrations WHERE name = '002_chat_window_start'")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.get_chat(chat.id).window_start == 0
    assert store.update_chat(chat.id, window_start=4).window_start == 4


def test_chats_and_messages_survive_reopening(tmp_path):
    store = Store(tmp_path / "reame.db")
    chat = new_chat(store, "first")
    store.add_message(chat.id, "user", "hello")
    store.add_message(chat.id, "assistant", "hi", tokens=[1, 2, 3], tokens_model="m",
                      stats={"generated": 3})
    reopened = Store(tmp_path / "reame.db")
    messages = reopened.messages(chat.id)
    assert [(m.position, m.role, m.content) for m in messages] == [
        (0, "user", "hello"), (1, "assistant", "hi")]
    assert messages[1].token_list == [1, 2, 3]
    assert messages[1].stats_dict == {"generated": 3}
    assert reopened.get_chat(chat.id).title == "first"


def test_list_is_most_recently_active_first(store):
    older, newer = new_chat(store, "older"), new_chat(store, "newer")
    assert [c.title for c in store.list_chats()] == ["newer", "older"]
    store.add_message(older.id, "user", "bump")
    assert [c.id for c in store.list_chats()] == [older.id, newer.id]


def test_delete_chat_removes_its_messages(store, tmp_path):
    chat, other = new_chat(store), new_chat(store)
    store.add_message(chat.id, "user", "x")
    store.add_message(other.id, "user", "y")
    store.delete_chat(chat.id)
    with pytest.raises(ChatNotFound):
        store.get_chat(chat.id)
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT chat_id FROM message").fetchall() == [(other.id,)]


def test_unknown_chat_raises(store):
    with pytest.raises(ChatNotFound, match="chat 42 does not exist"):
        store.get_chat(42)
    with pytest.raises(ChatNotFound):
        store.add_message(42, "user", "x")
    with pytest.raises(ChatNotFound):
        store.update_chat(42, title="x")


def test_a_new_version_keeps_the_old_one(store):
    chat = new_chat(store)
    for n in range(4):
        store.add_message(chat.id, "user" if n % 2 == 0 else "assistant", str(n))
    store.rewind(chat.id, 2)  # an edit of message 2
    assert [m.content for m in store.messages(chat.id)] == ["0", "1"]
    edited = store.add_message(chat.id, "user", "2b")
    store.add_message(chat.id, "assistant", "3b")
    thread = store.thread(chat.id)
    assert [m.content for m in thread.branch] == ["0", "1", "2b", "3b"]
    assert len(thread.messages) == 6, "nothing was deleted"
    assert thread.version(edited) == (2, 2)
    assert thread.version(thread.branch[0]) == (1, 1)
    original = next(m for m in thread.messages if m.content == "2")
    assert [m.content for m in store.show_version(chat.id, original.id)] == ["0", "1", "2", "3"]
    assert [m.content for m in store.show_version(chat.id, edited.id)] == ["0", "1", "2b", "3b"]


def test_a_reply_follows_the_message_it_answers_whatever_is_shown(store):
    chat = new_chat(store)
    question = store.add_message(chat.id, "user", "q")
    store.rewind(chat.id, 0)
    store.add_message(chat.id, "user", "q2")  # shown meanwhile: another version
    reply = store.add_message(chat.id, "assistant", "a", after=question.id)
    assert [m.content for m in store.messages(chat.id)] == ["q", "a"]
    assert reply.position == 1


def test_a_database_of_lists_becomes_one_branch_each(tmp_path):
    path = tmp_path / "reame.db"
    store = Store(path)
    chat = new_chat(store)
    for n in range(3):
        store.add_message(chat.id, "user" if n % 2 == 0 else "assistant", str(n))
    empty = new_chat(store)
    conn = sqlite3.connect(path)  # as a database made before the message tree
    conn.execute("DROP INDEX ix_message_parent_id")
    conn.execute("ALTER TABLE message DROP COLUMN parent_id")
    conn.execute("ALTER TABLE chat DROP COLUMN leaf_id")
    conn.execute("ALTER TABLE chat DROP COLUMN branched_from")
    conn.execute("DELETE FROM migrations WHERE name = '004_message_tree'")
    conn.commit()
    conn.close()
    upgraded = Store(path)
    assert [m.content for m in upgraded.messages(chat.id)] == ["0", "1", "2"]
    assert upgraded.messages(empty.id) == []
    upgraded.add_message(chat.id, "assistant", "3")
    assert [m.position for m in upgraded.messages(chat.id)] == [0, 1, 2, 3]
