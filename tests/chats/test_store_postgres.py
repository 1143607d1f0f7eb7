"""The store on PostgreSQL as several Reame nodes use it: migrations from an empty database,
nodes that start and write at once, and the tools that open the database (config, accounts,
backup). The checks both databases share are in tests/chats/test_store.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from reame.accounts.cli import run_command
from reame.accounts.users import Accounts
from reame.admin.backup import POSTGRESQL, BackupError, backup, restore, run_backup
from reame.admin.live_settings import without_password
from reame.chats.store import DatabaseUnavailable, Store, revisions
from reame.config.reame_conf import ConfigError, load_config
from reame.config.refusals import ChatNotFound

from tests.conftest import ROOT, at_once, free_port
from tests.postgres import postgres, postgres_url  # noqa: F401 - fixtures

NODES = 2
WORKERS = 4  # threads per node, as a server's requests are
CHATS = 8  # per worker


def new_chat(store, title="t"):
    return store.create_chat(title=title, system_prompt="s", temperature=0.5, top_p=0.9,
                             max_tokens=10)


def rows(store: Store, sql: str) -> list[tuple]:
    with store.db.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql))]


def test_an_empty_database_gets_every_table_index_and_migration(postgres_url):  # noqa: F811
    store = Store(postgres_url)
    assert rows(store, "SELECT version_num FROM alembic_version") == [(revisions()[-1],)]
    types = dict(rows(store, "SELECT table_name || '.' || column_name, data_type FROM "
                             "information_schema.columns WHERE table_schema = 'public'"))
    assert types["chat.id"] == types["message.id"] == types["message.chat_id"] == "bigint"
    assert types["chat.updated_at"] == "double precision"
    assert types["chat.search_vector"] == types["message.search_vector"] == "tsvector"
    indexes = {name for (name,) in rows(store, "SELECT indexname FROM pg_indexes")}
    assert {"ix_chat_owner", "ix_chat_updated_at", "ix_message_chat_id",
            "ix_message_parent_id", "ix_chat_search", "ix_message_search"} <= indexes
    assert store.path is None and "***" in store.where and "127.0.0.1" in store.where


def test_a_role_that_owns_its_database_needs_no_superuser(postgres):  # noqa: F811
    # The setup docs/self-hosting.md tells: createuser reame; createdb --owner reame reame.
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute("CREATE ROLE chats LOGIN PASSWORD 'chats-password'")
        conn.execute("CREATE DATABASE chats OWNER chats")
    store = Store(f"postgresql://chats:chats-password@127.0.0.1:{postgres.port}/chats")
    chat = new_chat(store, "Un café")
    assert [f.chat.id for f in store.search(None, "cafe")] == [chat.id]
    store.db.dispose()


def test_nodes_starting_together_on_an_empty_database_migrate_it_once(postgres_url):  # noqa: F811
    stores = at_once([lambda: Store(postgres_url) for _ in range(3)])
    assert rows(stores[0], "SELECT version_num FROM alembic_version") == [(revisions()[-1],)]
    chat = new_chat(stores[1])
    assert stores[2].get_chat(chat.id).title == "t"


def test_two_nodes_writing_at_once_lose_and_mix_no_chat(postgres_url):  # noqa: F811
    nodes = [Store(postgres_url) for _ in range(NODES)]

    def work(node: int, worker: int) -> list[tuple[int, str]]:
        store, made = nodes[node], []
        for n in range(CHATS):
            tag = f"node{node}-worker{worker}-chat{n}"
            chat = new_chat(store, tag)
            for k in range(3):
                store.add_message(chat.id, "user" if k % 2 == 0 else "assistant", f"{tag} {k}")
            made.append((chat.id, tag))
        return made

    made = [chat for chats in at_once([lambda n=n, w=w: work(n, w) for n in range(NODES)
                                       for w in range(WORKERS)]) for chat in chats]
    assert len({chat_id for chat_id, _ in made}) == NODES * WORKERS * CHATS, "ids never shared"
    for reader in nodes:  # each node sees every chat, whoever wrote it
        assert reader.chat_ids() == {chat_id for chat_id, _ in made}
        for chat_id, tag in made:
            assert reader.get_chat(chat_id).title == tag
            assert [(m.position, m.content) for m in reader.messages(chat_id)] == [
                (k, f"{tag} {k}") for k in range(3)]


def test_two_nodes_adding_to_one_chat_take_turns(postgres_url):  # noqa: F811
    a, b = Store(postgres_url), Store(postgres_url)
    chat = new_chat(a)

    def add(store: Store, name: str) -> None:
        for k in range(15):
            store.add_message(chat.id, "user", f"{name}{k}")

    at_once([lambda: add(a, "a"), lambda: add(b, "b")])
    branch = b.messages(chat.id)
    # Each message follows the one that was last when it was added: one branch of all 30
    # (had two read the same last message, one would hang beside the other, out of it).
    assert [m.position for m in branch] == list(range(30))
    assert sorted(m.content for m in branch) == sorted(f"{n}{k}" for n in "ab" for k in range(15))


def test_a_chat_deleted_by_one_node_while_another_adds_to_it(postgres_url):  # noqa: F811
    a, b = Store(postgres_url), Store(postgres_url)
    for _ in range(5):
        chat = new_chat(a)

        def add(chat_id=chat.id) -> None:
            try:
                for k in range(20):
                    b.add_message(chat_id, "user", str(k))
            except ChatNotFound:
                pass  # deleted first: refused, never a message of no chat

        at_once([add, lambda chat_id=chat.id: a.delete_chat(chat_id)])
        assert not b.has_chat(chat.id)
        assert rows(a, f"SELECT count(*) FROM message WHERE chat_id = {chat.id}") == [(0,)]


def test_one_node_finds_what_another_wrote(postgres_url):  # noqa: F811
    a, b = Store(postgres_url), Store(postgres_url)
    chat = new_chat(a, "Trip")
    a.add_message(chat.id, "user", "Kilimanjaro in March")
    [found] = b.search(None, "kilima")
    assert found.chat.id == chat.id and "Kilimanjaro" in found.snippet


def test_a_nul_in_a_text_is_stored_as_a_replacement_character(postgres_url):  # noqa: F811
    store = Store(postgres_url)
    chat = store.create_chat(title="a\x00b", system_prompt="\x00", temperature=0.5, top_p=0.9,
                             max_tokens=10)
    store.add_message(chat.id, "user", "before\x00after")
    assert store.get_chat(chat.id).title == "a\ufffdb"
    assert [m.content for m in store.messages(chat.id)] == ["before\ufffdafter"]


def test_an_unreachable_server_is_said_plainly_without_the_password(postgres):  # noqa: F811
    wrong = f"postgresql://reame:not-the-password@127.0.0.1:{postgres.port}/postgres"
    with pytest.raises(DatabaseUnavailable, match="cannot use the database") as refused:
        Store(wrong)
    assert "not-the-password" not in str(refused.value)
    with pytest.raises(DatabaseUnavailable, match=f"127.0.0.1:{free_port()}|refused"):
        Store(f"postgresql://reame:x@127.0.0.1:{free_port()}/reame")


def test_the_app_refuses_to_start_on_an_unreachable_database_in_one_line(tmp_path):
    closed = f"postgresql://reame:hunter2@127.0.0.1:{free_port()}/reame"
    (tmp_path / "reame.conf").write_text(f"[storage]\ndatabase_url = {closed}\n")
    started = subprocess.run([sys.executable, str(ROOT / "app.py"), "--config",
                              str(tmp_path / "reame.conf")], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    assert started.returncode == 2
    assert started.stderr.startswith("reame: ") and "Traceback" not in started.stderr
    assert "hunter2" not in started.stderr


def test_the_settings_show_the_database_url_without_its_password():
    assert without_password("postgresql://reame:hunter2@db.example.org:5432/reame") == (
        "postgresql://reame:***@db.example.org:5432/reame")
    assert without_password("postgresql://db.example.org/reame") == (
        "postgresql://db.example.org/reame")


# the tools that open the database


def write_conf(folder: Path, database_url: str) -> Path:
    """A reame.conf in folder: accounts in users.json, the chats at database_url ("": the
    SQLite file), the KV files in kv/."""
    path = folder / "reame.conf"
    path.write_text(f"[server]\nusers_file = users.json\n[storage]\nsessions_dir = sessions\n"
                    f"database_url = {database_url}\n[cache]\ndir = kv\n")
    return path


def test_the_config_takes_a_postgresql_url_or_nothing(tmp_path, postgres_url):  # noqa: F811
    config = load_config(write_conf(tmp_path, postgres_url))
    assert config.storage.database == postgres_url
    plain = load_config(write_conf(tmp_path, ""))
    assert plain.storage.database == tmp_path / "sessions" / "reame.db"
    with pytest.raises(ConfigError, match=r"\[storage\] database_url: expected a PostgreSQL "
                                          r"URL.*starts with mysql://") as refused:
        load_config(write_conf(tmp_path, "mysql://root:hunter2@db/reame"))
    assert "hunter2" not in str(refused.value)


def test_adopt_gives_chats_in_postgresql(tmp_path, postgres_url):  # noqa: F811
    config = write_conf(tmp_path, postgres_url)
    accounts = Accounts(tmp_path / "users.json")
    accounts.add_user("alice", "correct horse")
    store = Store(postgres_url)
    chat = new_chat(store)  # made before accounts: it has no owner
    assert run_command(["adopt", "alice", "--config", str(config)], config) == 0
    assert store.get_chat(chat.id).owner == accounts.user_id("alice")


def test_backup_leaves_the_database_to_pg_dump(tmp_path, postgres_url, capsys):  # noqa: F811
    config_path = write_conf(tmp_path, postgres_url)
    (tmp_path / "kv").mkdir()
    (tmp_path / "kv" / "reame-totals.json").write_text(json.dumps({"counts": {}}))
    Store(postgres_url)
    assert run_backup([str(tmp_path / "copy"), "--config", str(config_path)], config_path) == 0
    said = capsys.readouterr().out
    assert "pg_dump --format=custom" in said and "the database: in PostgreSQL" in said
    password = postgres_url.split(":")[2].split("@")[0]
    assert password not in said and "postgresql://reame@127.0.0.1" in said
    manifest = json.loads((tmp_path / "copy" / "manifest.json").read_text())
    assert manifest["database"] == POSTGRESQL
    assert sorted(f["path"] for f in manifest["files"]) == ["kv/reame-totals.json",
                                                           "reame.conf"]
    assert not (tmp_path / "copy" / "reame.db").exists()
    config = load_config(config_path)
    restored = restore(tmp_path / "copy", config, force=True)
    assert [entry.path for entry, _ in restored.written] == ["kv/reame-totals.json"]
    (tmp_path / "elsewhere").mkdir()
    sqlite_config = load_config(write_conf(tmp_path / "elsewhere", ""))
    with pytest.raises(BackupError, match="holds no database: its chats were in PostgreSQL"):
        restore(tmp_path / "copy", sqlite_config, force=True)


def test_a_sqlite_backup_is_refused_by_a_postgresql_config(tmp_path, postgres_url):  # noqa: F811
    (tmp_path / "old").mkdir()
    sqlite_config = load_config(write_conf(tmp_path / "old", ""))
    new_chat(Store(sqlite_config.storage.database_path))
    backup(sqlite_config, tmp_path / "copy")
    (tmp_path / "new").mkdir()
    with pytest.raises(BackupError, match="in a SQLite file, but the config keeps them in "
                                          "PostgreSQL"):
        restore(tmp_path / "copy", load_config(write_conf(tmp_path / "new", postgres_url)))
