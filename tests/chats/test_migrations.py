"""The schema's migrations through Alembic (reame/chats/store/alembic): a database the runner
before Alembic migrated is stamped, not migrated again, and keeps its chats; one from before
some steps, or stamped at an older revision, gets the rest; head is what the models declare.
Each test taking `database` runs on a SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from reame.chats.store import Store, migrations, revisions
from reame.chats.store.migrations import alembic_config, enable_wal, migrate, schema_object

from tests.conftest import at_once
from tests.postgres import postgres, postgres_url  # noqa: F401 - fixtures

# The steps of the runner before Alembic, as it named them in its migrations table.
OLD_STEPS = ["001_create_chat_and_message", "002_chat_window_start", "003_chat_owner",
             "004_message_tree", "005_search_and_pins", "006_ids_never_reused"]
# The steps since, which every database the old runner made still gets.
NEW_STEPS = ["007_archive", "008_stored_responses", "009_tool_calls", "010_user_instructions"]
HEAD = NEW_STEPS[-1]
OLD_RELEASE = Path(__file__).parents[1] / "data" / "reame-before-autoincrement.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """A SQLite file, or a new PostgreSQL database's URL (as in tests/chats/test_store.py)."""
    if request.param == "sqlite":
        return tmp_path / "reame.db"
    return request.getfixturevalue("postgres_url")


def engine_of(where: Path | str) -> Engine:
    """An engine on the database, as Store makes one, without migrating it."""
    if isinstance(where, Path):
        engine = create_engine(f"sqlite:///{where}")
        event.listen(engine, "connect", enable_wal)
        return engine
    return create_engine(where.replace("postgresql://", "postgresql+psycopg://", 1))


def rows(engine: Engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql))]


def tables(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def record_as_the_old_runner(engine: Engine, done: list[str]) -> None:
    """Alembic's record replaced by the old runner's: its migrations table (its own SQL) with
    the steps done."""
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
        real = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "REAL"
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, "
                          f"applied_at {real})"))
        for name in done:
            conn.execute(text("INSERT INTO migrations VALUES (:n, :t)"),
                         {"n": name, "t": time.time()})


def made_by_the_old_runner(engine: Engine) -> None:
    """A new database as the old runner made it: step 001 was create_all of the models, 002-004
    found their columns there, 005 ran its search SQL (kept as it was in revision 005), and 006
    had nothing to rebuild; each recorded."""
    scripts = ScriptDirectory.from_config(alembic_config())
    search = scripts.get_revision("005_search_and_pins").module
    with engine.begin() as conn:
        SQLModel.metadata.create_all(conn)
        postgres = conn.dialect.name == "postgresql"
        for statement in search.POSTGRES_SEARCH if postgres else search.SQLITE_SEARCH:
            conn.execute(text(statement))
    record_as_the_old_runner(engine, OLD_STEPS)


def write_chat(engine: Engine, title: str, contents: list[str]) -> int:
    """A chat and its messages written in plain SQL, as the release of the database's schema
    did: a tree (parent_id, leaf_id) if the schema has one, else a list."""
    with engine.begin() as conn:
        chat_columns = {column["name"] for column in inspect(conn).get_columns("chat")}
        tree = "leaf_id" in chat_columns
        # create_all's tables have no server defaults: those columns are given, if there
        given = {name: value for name, value in (("window_start", "0"), ("pinned", "false"),
                                                 ("archived", "false"))
                 if name in chat_columns}
        chat_id = conn.execute(text(
            f"INSERT INTO chat (title, system_prompt, temperature, top_p, max_tokens, "
            f"created_at, updated_at{''.join(', ' + name for name in given)}) VALUES "
            f"(:t, 's', 0.5, 0.9, 10, 1, 1{''.join(', ' + value for value in given.values())}) "
            f"RETURNING id"), {"t": title}).scalar()
        parent = None
        for position, content in enumerate(contents):
            values = {"c": chat_id, "p": position, "x": content, "parent": parent,
                      "r": "user" if position % 2 == 0 else "assistant"}
            parent = conn.execute(text(
                f"INSERT INTO message (chat_id, position, role, content, created_at, stopped"
                f"{', parent_id' if tree else ''}) VALUES (:c, :p, :r, :x, 1, false"
                f"{', :parent' if tree else ''}) RETURNING id"), values).scalar()
        if tree:
            conn.execute(text("UPDATE chat SET leaf_id = :m WHERE id = :c"),
                         {"m": parent, "c": chat_id})
    return chat_id


def differences(engine: Engine) -> list:
    """What autogenerate finds between the database and the models (search's extras aside)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": schema_object})
        return compare_metadata(context, SQLModel.metadata)


def test_the_revisions_keep_the_old_runners_names_and_order():
    assert revisions() == OLD_STEPS + NEW_STEPS
    assert migrations.HEAD == revisions()[-1], "migrations.HEAD names the newest revision"


def test_a_database_the_old_runner_made_is_stamped_not_migrated_again(database):
    engine = engine_of(database)
    made_by_the_old_runner(engine)
    chat_id = write_chat(engine, "Un café", ["bonjour", "salut"])
    assert migrate(engine) == NEW_STEPS, "the old runner's steps do not run again"
    assert rows(engine, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    assert "migrations" not in tables(engine), "Alembic's record replaces it"
    assert migrate(engine) == []
    store = Store(database)
    assert store.get_chat(chat_id).title == "Un café"
    assert [m.content for m in store.messages(chat_id)] == ["bonjour", "salut"]
    assert [f.chat.id for f in store.search(None, "cafe")] == [chat_id]
    assert differences(engine) == []
    engine.dispose()
    store.db.dispose()


def test_nodes_starting_on_an_old_runner_database_stamp_it_once(postgres_url):  # noqa: F811
    engine = engine_of(postgres_url)
    made_by_the_old_runner(engine)
    chat_id = write_chat(engine, "t", ["hello"])
    stores = at_once([lambda: Store(postgres_url) for _ in range(3)])
    assert rows(engine, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    assert "migrations" not in tables(engine)
    assert [m.content for m in stores[2].messages(chat_id)] == ["hello"]
    engine.dispose()
    for store in stores:
        store.db.dispose()


def test_an_old_runner_database_from_before_some_steps_gets_the_rest(database):
    engine = engine_of(database)
    assert migrate(engine, "003_chat_owner") == OLD_STEPS[:3]  # the schema as of 003
    chat_id = write_chat(engine, "Trip", ["Kilimanjaro in March?", "In the dry season.", "ok"])
    record_as_the_old_runner(engine, OLD_STEPS[:3])
    assert migrate(engine) == OLD_STEPS[3:] + NEW_STEPS
    assert rows(engine, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    assert "migrations" not in tables(engine)
    store = Store(database)
    assert [m.content for m in store.messages(chat_id)] == [
        "Kilimanjaro in March?", "In the dry season.", "ok"], "the list became one branch"
    assert [f.chat.id for f in store.search(None, "kilima")] == [chat_id], "search filled"
    assert store.add_message(chat_id, "assistant", "next").position == 3
    assert differences(engine) == []
    engine.dispose()
    store.db.dispose()


def test_a_database_stamped_at_an_older_revision_gets_the_rest(database):
    engine = engine_of(database)
    assert migrate(engine, "002_chat_window_start") == OLD_STEPS[:2]
    chat_id = write_chat(engine, "Old", ["a", "b"])
    assert migrate(engine) == OLD_STEPS[2:] + NEW_STEPS
    store = Store(database)
    chat = store.get_chat(chat_id)
    assert (chat.owner, chat.pinned, chat.window_start) == (None, False, 0)
    assert store.list_chats(None)[0].id == chat_id, "made without accounts: no owner's"
    assert store.tree(chat_id).branch[-1].content == "b"
    assert differences(engine) == []
    engine.dispose()
    store.db.dispose()


def test_head_is_what_the_models_declare(database):
    store = Store(database)
    assert differences(store.db) == []
    with store.db.begin() as conn:  # the comparison sees a difference when there is one
        conn.execute(text("DROP INDEX ix_chat_owner"))
    assert [diff[0] for diff in differences(store.db)] == ["add_index"]
    store.db.dispose()


def test_the_previous_releases_sqlite_file_is_stamped_then_rebuilt(tmp_path):
    """tests/data/reame-before-autoincrement.db: the old runner had done 001-005."""
    path = tmp_path / "reame.db"
    shutil.copy(OLD_RELEASE, path)
    engine = engine_of(path)
    assert migrate(engine) == ["006_ids_never_reused", *NEW_STEPS], "001-005 not run again"
    assert rows(engine, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    assert differences(engine) == []


def test_an_old_runner_that_recorded_006_without_its_rebuild_gets_it(tmp_path):
    """The old runner recorded 006 in its transaction and rebuilt the tables after it: a
    start cut short between the two left 006 recorded, the tables as they were."""
    path = tmp_path / "reame.db"
    shutil.copy(OLD_RELEASE, path)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO migrations VALUES ('006_ids_never_reused', 0)")
    engine = engine_of(path)
    assert migrate(engine) == ["006_ids_never_reused", *NEW_STEPS]
    sql = rows(engine, "SELECT sql FROM sqlite_master WHERE name IN ('chat', 'message')")
    assert all("AUTOINCREMENT" in row[0] for row in sql)


def test_starting_on_an_up_to_date_database_logs_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO)  # the app's level

    def said() -> list[str]:  # SQLAlchemy's own (each statement at INFO) aside
        return [f"{record.name}: {record.getMessage()}" for record in caplog.records
                if not record.name.startswith("sqlalchemy")]

    Store(tmp_path / "reame.db")
    assert said() == [f"reame.chats.store.migrations: database migrated: "
                      f"{', '.join(OLD_STEPS + NEW_STEPS)}"], "one line, none of Alembic's"
    caplog.clear()
    Store(tmp_path / "reame.db")
    assert said() == []


def test_a_start_on_an_up_to_date_database_imports_no_alembic(tmp_path):
    """Alembic (11.5 MB, 0.1 s) is imported only when there is something to migrate."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    opened = ("import sys; from pathlib import Path; from reame.chats.store import Store; "
              f"Store(Path({str(tmp_path / 'reame.db')!r})); print('alembic' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", opened], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, check=True).stdout.strip()
            for _ in range(2)]
    assert runs == ["True", "False"], "new: migrated with Alembic; then at head: no Alembic"
