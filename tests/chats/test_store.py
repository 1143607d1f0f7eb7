"""The store on both databases it runs on: each test taking `database` runs on a SQLite file
and on a fresh PostgreSQL database (tests/postgres.py), with the same assertions."""

import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from reame.chats.store import END_MARK, MARK, Store, revisions
from reame.chats.store.migrations import migrate
from reame.config.refusals import ChatNotFound

from tests.postgres import postgres, postgres_url  # noqa: F401 - fixtures


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """Where a Store keeps the chats: a SQLite file, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        return tmp_path / "reame.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(database) -> Store:
    store = Store(database)
    yield store
    store.db.dispose()


def new_chat(store, title="t", owner=None):
    return store.create_chat(title=title, system_prompt="s", temperature=0.5, top_p=0.9,
                             max_tokens=10, owner=owner)


def run_sql(store: Store, *statements: str) -> None:
    """Change the database behind the store's back (as an older release left it)."""
    with store.db.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    store.db.dispose()


def test_database_uses_wal_and_records_its_revision(tmp_path):
    store = Store(tmp_path / "db" / "reame.db")
    new_chat(store)
    conn = sqlite3.connect(tmp_path / "db" / "reame.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
        (revisions()[-1],)]


def test_migrations_run_once(database):
    Store(database)
    again = Store(database)
    assert migrate(again.db) == []
    with again.db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1


def test_a_database_from_before_the_window_column_is_upgraded(database):
    store = Store(database)
    chat = new_chat(store)
    run_sql(store, "ALTER TABLE chat DROP COLUMN window_start",  # as the first release made it
            "UPDATE alembic_version SET version_num = '001_create_chat_and_message'")
    store = Store(database)
    assert store.get_chat(chat.id).window_start == 0
    assert store.update_chat(chat.id, window_start=4).window_start == 4


def test_ids_of_deleted_chats_and_messages_are_never_given_again(database):
    """A reply, a KV file or a link that outlives its chat must not land in a later one."""
    store = Store(database)
    new_chat(store, "kept")
    gone = new_chat(store, "deleted")  # the largest id, the one SQLite's rowid reuses
    message = store.add_message(gone.id, "user", "hi")
    store.delete_chat(gone.id)
    again = new_chat(store, "new")
    assert again.id > gone.id
    assert store.add_message(again.id, "user", "hello").id > message.id
    with pytest.raises(ChatNotFound):
        store.add_message(gone.id, "assistant", "a late reply")


def test_a_write_that_expects_an_owner_checks_it_in_its_transaction(store):
    chat = new_chat(store, owner="alice")
    assert store.has_chat(chat.id, "alice") and not store.has_chat(chat.id, "bob")
    for write in (lambda: store.add_message(chat.id, "assistant", "x", expect_owner="bob"),
                  lambda: store.update_chat(chat.id, title="x", expect_owner="bob"),
                  lambda: store.add_message(chat.id, "user", "x", expect_owner=None)):
        with pytest.raises(ChatNotFound):
            write()
    assert store.messages(chat.id) == [] and store.get_chat(chat.id).title == "t"
    assert store.add_message(chat.id, "user", "mine", expect_owner="alice").content == "mine"


def test_a_sqlite_database_of_the_previous_release_gets_ids_never_reused(tmp_path):
    """tests/data/reame-before-autoincrement.db was made by the release before: chats of
    alice and bob with messages, and bob's newest chat deleted."""
    path = tmp_path / "reame.db"
    shutil.copy(Path(__file__).parents[1] / "data" / "reame-before-autoincrement.db", path)
    store = Store(path)
    assert [c.title for c in store.list_chats("alice")] == ["Cafés in Lyon"]
    [bobs] = store.list_chats("bob")
    assert [m.content for m in store.messages(bobs.id)] == [
        "hello from Bob's plan", "a reply about the café"]
    assert store.messages(bobs.id)[-1].token_list == [1, 2, 3]
    assert [found.chat.title for found in store.search("alice", "cafe")] == ["Cafés in Lyon"]
    sql = sqlite3.connect(path).execute(
        "SELECT sql FROM sqlite_master WHERE name IN ('chat', 'message')").fetchall()
    assert all("AUTOINCREMENT" in row[0] for row in sql)
    store.delete_chat(bobs.id)
    assert new_chat(store, "next", owner="carol").id > bobs.id
    assert Store(path).get_chat(bobs.id + 1)  # reopened: nothing rebuilt twice, nothing lost
    with pytest.raises(Exception):  # foreign keys still hold
        with store.db.begin() as conn:
            conn.execute(text("INSERT INTO message (chat_id, position, role, content, "
                              "created_at, stopped) VALUES (9999, 0, 'user', 'x', 0, 0)"))


def test_chats_and_messages_survive_reopening(database):
    store = Store(database)
    chat = new_chat(store, "first")
    store.add_message(chat.id, "user", "hello")
    store.add_message(chat.id, "assistant", "hi", tokens=[1, 2, 3], tokens_model="m",
                      stats={"generated": 3})
    reopened = Store(database)
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


def test_pinned_chats_come_first_and_renames_are_kept(store):
    pinned, other = new_chat(store, "pinned"), new_chat(store, "other")
    store.update_chat(pinned.id, pinned=True, title="renamed")
    assert [(c.title, c.pinned) for c in store.list_chats()] == [("renamed", True),
                                                                ("other", False)]
    assert store.newest_chat().id == other.id, "the chat made last, pinned or not"


def test_delete_chat_removes_its_messages(store):
    chat, other = new_chat(store), new_chat(store)
    store.add_message(chat.id, "user", "x")
    store.add_message(other.id, "user", "y")
    store.delete_chat(chat.id)
    with pytest.raises(ChatNotFound):
        store.get_chat(chat.id)
    with store.db.connect() as conn:
        assert conn.execute(text("SELECT chat_id FROM message")).all() == [(other.id,)]


def test_unknown_chat_raises(store):
    with pytest.raises(ChatNotFound, match="chat 42 does not exist"):
        store.get_chat(42)
    with pytest.raises(ChatNotFound):
        store.add_message(42, "user", "x")
    with pytest.raises(ChatNotFound):
        store.update_chat(42, title="x")
    with pytest.raises(ChatNotFound):
        store.get_chat(2**63)
    assert not store.has_chat(2**40)


def test_a_new_version_keeps_the_old_one(store):
    chat = new_chat(store)
    for n in range(4):
        store.add_message(chat.id, "user" if n % 2 == 0 else "assistant", str(n))
    store.rewind(chat.id, 2)  # an edit of message 2
    assert [m.content for m in store.messages(chat.id)] == ["0", "1"]
    edited = store.add_message(chat.id, "user", "2b")
    store.add_message(chat.id, "assistant", "3b")
    tree = store.tree(chat.id)
    assert [m.content for m in tree.branch] == ["0", "1", "2b", "3b"]
    assert len(tree.messages) == 6, "nothing was deleted"
    assert tree.version(edited) == (2, 2)
    assert tree.version(tree.branch[0]) == (1, 1)
    original = next(m for m in tree.messages if m.content == "2")
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


def test_a_reply_written_as_it_streams_is_completed_in_its_own_row(store):
    """The rows a streaming reply writes (reame/chats/chat_keeper.py): begun by add_message,
    its text updated by write_so_far (search sees it), completed by end_reply in that row,
    which becomes the leaf again even if another version was shown meanwhile."""
    chat = new_chat(store, owner="alice")
    question = store.add_message(chat.id, "user", "q")
    row = store.add_message(chat.id, "assistant", "Zebras", stopped=True,
                            stats={"stopped": True, "unfinished": True}, after=question.id)
    assert store.write_so_far(row.id, "Zebras live in Africa")
    assert ids(store.search("alice", "africa")) == [chat.id]
    shown = store.tree(chat.id).branch[-1]
    assert (shown.id, shown.content, shown.stopped, shown.token_list) == (
        row.id, "Zebras live in Africa", True, None)
    store.rewind(chat.id, 0)  # the user shows another version meanwhile
    store.add_message(chat.id, "user", "q2")
    with pytest.raises(ChatNotFound):
        store.end_reply(chat.id, row.id, "x", tokens=None, tokens_model=None, stats=None,
                        stopped=False, after=question.id, expect_owner="bob")
    kept = store.end_reply(chat.id, row.id, "Zebras live in Africa.", tokens=[1, 2],
                           tokens_model="m", stats={"generated": 2}, stopped=False,
                           after=question.id, expect_owner="alice")
    tree = store.tree(chat.id)
    assert kept.id == row.id == tree.leaf_id and len(tree.messages) == 3
    assert (kept.content, kept.stopped) == ("Zebras live in Africa.", False)
    assert [m.content for m in tree.branch] == ["q", "Zebras live in Africa."]
    final = tree.branch[-1]
    assert (final.token_list, final.tokens_model, final.stats_dict, final.stopped) == (
        [1, 2], "m", {"generated": 2}, False)
    assert final.created_at >= row.created_at and store.get_chat(chat.id).updated_at >= \
        final.created_at
    store.delete_chat(chat.id)
    assert not store.write_so_far(row.id, "more"), "its chat was deleted: nothing written"
    with pytest.raises(ChatNotFound):
        store.end_reply(chat.id, row.id, "x", tokens=None, tokens_model=None, stats=None,
                        stopped=False, after=None)


def test_a_database_of_lists_becomes_one_branch_each(database):
    store = Store(database)
    chat = new_chat(store)
    for n in range(3):
        store.add_message(chat.id, "user" if n % 2 == 0 else "assistant", str(n))
    empty = new_chat(store)
    run_sql(store, "DROP INDEX ix_message_parent_id",  # as a database made before the tree
            "ALTER TABLE message DROP COLUMN parent_id", "ALTER TABLE chat DROP COLUMN leaf_id",
            "ALTER TABLE chat DROP COLUMN branched_from",
            "UPDATE alembic_version SET version_num = '003_chat_owner'")
    upgraded = Store(database)
    assert [m.content for m in upgraded.messages(chat.id)] == ["0", "1", "2"]
    assert upgraded.messages(empty.id) == []
    upgraded.add_message(chat.id, "assistant", "3")
    assert [m.position for m in upgraded.messages(chat.id)] == [0, 1, 2, 3]


# search: the same results from FTS5 (SQLite) and tsvector (PostgreSQL)


def ids(found) -> list[int]:
    return [f.chat.id for f in found]


def test_search_wants_every_word_in_one_message_the_last_as_a_start(store):
    zebras = new_chat(store, "Animals")
    store.add_message(zebras.id, "user", "Where do zebras live?")
    store.add_message(zebras.id, "assistant", "Zebras live in Africa, on the savanna.")
    other = new_chat(store, "Other")
    store.add_message(other.id, "user", "Nothing about them here")
    assert ids(store.search(None, "zebras africa")) == [zebras.id]
    assert ids(store.search(None, "AFRICA sava")) == [zebras.id], "the last word as a start"
    assert store.search(None, "sava africa") == [], "only the last word is a start"
    assert store.search(None, "animals zebras") == [], "title and message are searched apart"
    assert store.search(None, "where savanna") == [], "every word in one message"
    assert store.search(None, "  ?!  ") == [] and store.search(None, "") == []


def test_search_folds_case_and_diacritics_and_marks_the_match(store):
    chat = new_chat(store, "Breakfast")
    store.add_message(chat.id, "user", "Le café est prêt")
    [found] = store.search(None, "CAFE pret")
    assert found.chat.id == chat.id
    assert found.snippet == f"Le {MARK}café{END_MARK} est {MARK}prêt{END_MARK}"


def test_search_snippets_are_of_the_newest_match_with_ellipses(store):
    chat = new_chat(store)
    store.add_message(chat.id, "user", "the river one")
    filler = " ".join(f"word{n}" for n in range(30))
    store.add_message(chat.id, "assistant", f"{filler} the river two {filler}")
    [found] = store.search(None, "river")
    assert found.snippet.startswith("…") and found.snippet.endswith("…"), found.snippet
    assert f"{MARK}river{END_MARK} two" in found.snippet
    assert len(found.snippet.split()) <= 16


def test_search_finds_words_inside_names_and_addresses(store):
    chat = new_chat(store)
    store.add_message(chat.id, "user", "open notes.txt and mail bob@example.org about v2.5")
    for words in ("txt", "notes.txt", "example", "bob@example.org", "v2"):
        assert ids(store.search(None, words)) == [chat.id], words


def test_search_orders_like_the_list_and_stops_at_the_limit(store):
    chats = [new_chat(store, f"chat {n}") for n in range(5)]
    for chat in chats:
        store.add_message(chat.id, "user", f"ocean number {chat.id}")
    assert ids(store.search(None, "ocean", limit=3)) == [c.id for c in chats[:1:-1]]
    store.update_chat(chats[0].id, pinned=True)
    assert ids(store.search(None, "ocean"))[0] == chats[0].id, "pinned first"
    title_only = new_chat(store, "Quarterly report")
    [found] = store.search(None, "quarter")
    assert found.chat.id == title_only.id and found.snippet == ""


def test_search_sees_renames_and_deletes_and_only_the_owners_chats(store):
    mine = new_chat(store, "Holiday plans", owner="alice")
    store.add_message(mine.id, "user", "Zanzibar in June")
    assert ids(store.search("alice", "zanzibar")) == [mine.id]
    assert store.search("bob", "zanzibar") == [] and store.search(None, "zanzibar") == []
    store.update_chat(mine.id, title="Work trip")
    assert store.search("alice", "holiday") == []
    assert ids(store.search("alice", "work trip")) == [mine.id]
    store.delete_chat(mine.id)
    assert store.search("alice", "zanzibar") == [] and store.search("alice", "work") == []
