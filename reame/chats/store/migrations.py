"""The schema's migrations: named, ordered, idempotent, each run once and recorded; what
differs between SQLite and PostgreSQL is said where it does (SQLite's FTS5 tables kept by
triggers, PostgreSQL's tsvector columns; SQLite's rebuild for AUTOINCREMENT)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import SQLModel

from reame.chats.store.tables import Chat, Message


def _create_tables(conn: Connection) -> None:
    SQLModel.metadata.create_all(conn)


def _add_window_start(conn: Connection) -> None:
    if "window_start" not in _columns(conn, "chat"):  # a database made before the column existed
        conn.execute(text("ALTER TABLE chat ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0"))


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _add_owner(conn: Connection) -> None:
    if "owner" not in _columns(conn, "chat"):
        conn.execute(text("ALTER TABLE chat ADD COLUMN owner VARCHAR"))
        conn.execute(text("CREATE INDEX IF NOT EXISTS ix_chat_owner ON chat (owner)"))


def _columns(conn: Connection, table: str) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns(table)}


def _message_tree(conn: Connection) -> None:
    """Messages become a tree (parent_id) and a chat shows one branch of it (leaf_id): a chat
    stored as a list is that list's one branch."""
    if "parent_id" not in _columns(conn, "message"):
        conn.execute(text("ALTER TABLE message ADD COLUMN parent_id INTEGER"))
        conn.execute(text("UPDATE message SET parent_id = (SELECT before.id FROM message AS "
                          "before WHERE before.chat_id = message.chat_id AND before.position "
                          "= message.position - 1)"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_message_parent_id ON message (parent_id)"))
    chat_columns = _columns(conn, "chat")
    if "leaf_id" not in chat_columns:
        conn.execute(text("ALTER TABLE chat ADD COLUMN leaf_id INTEGER"))
        conn.execute(text("UPDATE chat SET leaf_id = (SELECT id FROM message WHERE "
                          "message.chat_id = chat.id ORDER BY position DESC LIMIT 1)"))
    if "branched_from" not in chat_columns:
        conn.execute(text("ALTER TABLE chat ADD COLUMN branched_from INTEGER"))


# Full-text search over titles and messages (SQLite's FTS5), kept up to date by triggers: rows
# are chat and message ids. Diacritics folded: "cafe" finds "café".
_SQLITE_SEARCH = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS message_fts USING fts5(content, chat_id UNINDEXED, "
    "tokenize = 'unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS chat_fts USING fts5(title, "
    "tokenize = 'unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS message_fts_insert AFTER INSERT ON message BEGIN "
    "INSERT INTO message_fts (rowid, content, chat_id) VALUES (new.id, new.content, "
    "new.chat_id); END",
    "CREATE TRIGGER IF NOT EXISTS message_fts_delete AFTER DELETE ON message BEGIN "
    "DELETE FROM message_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER IF NOT EXISTS message_fts_update AFTER UPDATE OF content ON message BEGIN "
    "UPDATE message_fts SET content = new.content WHERE rowid = new.id; END",
    "CREATE TRIGGER IF NOT EXISTS chat_fts_insert AFTER INSERT ON chat BEGIN "
    "INSERT INTO chat_fts (rowid, title) VALUES (new.id, new.title); END",
    "CREATE TRIGGER IF NOT EXISTS chat_fts_delete AFTER DELETE ON chat BEGIN "
    "DELETE FROM chat_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER IF NOT EXISTS chat_fts_update AFTER UPDATE OF title ON chat BEGIN "
    "UPDATE chat_fts SET title = new.title WHERE rowid = new.id; END",
)


# The same on PostgreSQL: a tsvector column computed from each title and message (generated:
# nothing else to keep up to date) with a GIN index. Its configuration folds case and
# diacritics like FTS5's tokenizer (unaccent, then simple: no stemming, no stop words). Its
# parser keeps "file.txt", "a@b.org" or "2.5" as one word where FTS5 makes two: those
# characters are read as spaces, so that a search for "txt" finds "file.txt" on both.
TS_CONFIG = "reame_search"
_TS_DOCUMENT = f"to_tsvector('{TS_CONFIG}', translate({{column}}, '.@/:', '    '))"
_POSTGRES_SEARCH = (
    "CREATE EXTENSION IF NOT EXISTS unaccent",
    f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = '{TS_CONFIG}') "
    f"THEN CREATE TEXT SEARCH CONFIGURATION {TS_CONFIG} (COPY = simple); "
    f"ALTER TEXT SEARCH CONFIGURATION {TS_CONFIG} ALTER MAPPING FOR asciiword, asciihword, "
    f"hword_asciipart, word, hword, hword_part, numword, numhword, hword_numpart "
    f"WITH unaccent, simple; END IF; END $$",
    "ALTER TABLE message ADD COLUMN IF NOT EXISTS search_vector tsvector GENERATED ALWAYS AS "
    f"({_TS_DOCUMENT.format(column='content')}) STORED",
    "CREATE INDEX IF NOT EXISTS ix_message_search ON message USING GIN (search_vector)",
    "ALTER TABLE chat ADD COLUMN IF NOT EXISTS search_vector tsvector GENERATED ALWAYS AS "
    f"({_TS_DOCUMENT.format(column='title')}) STORED",
    "CREATE INDEX IF NOT EXISTS ix_chat_search ON chat USING GIN (search_vector)",
)


def _search_and_pins(conn: Connection) -> None:
    """Chats can be pinned and searched: the search tables filled from what is stored."""
    if "pinned" not in _columns(conn, "chat"):
        false = "false" if is_postgres(conn) else "0"
        conn.execute(text(f"ALTER TABLE chat ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT {false}"))
    if is_postgres(conn):
        for statement in _POSTGRES_SEARCH:  # generated columns: filled as they are added
            conn.execute(text(statement))
        return
    for statement in _SQLITE_SEARCH:
        conn.execute(text(statement))
    conn.execute(text("DELETE FROM message_fts"))
    conn.execute(text("INSERT INTO message_fts (rowid, content, chat_id) "
                      "SELECT id, content, chat_id FROM message"))
    conn.execute(text("DELETE FROM chat_fts"))
    conn.execute(text("INSERT INTO chat_fts (rowid, title) SELECT id, title FROM chat"))


def _sqlite_ids_never_reused(engine: Engine) -> bool:
    """A SQLite database made before ids were AUTOINCREMENT gets its chat and message tables
    rebuilt with it (SQLite cannot change a primary key in place), by SQLite's documented
    procedure for other schema changes: foreign keys off, one transaction, a foreign key check
    before the commit. The search triggers and indexes, dropped with the old tables, are made
    again. Whether it ran. (The ids of chats deleted before it left no trace and may be given
    once more; nothing of them outlives it: their KV files went with them, and no turn
    outlives the restart an upgrade takes.)"""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        tables = dict(conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table'").all())
        if "AUTOINCREMENT" in tables.get("chat", "AUTOINCREMENT").upper():
            return False  # a new database (created so), or done already
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            for model in (Chat, Message):
                table = model.__table__
                ddl = str(CreateTable(table).compile(dialect=conn.dialect)).strip()
                conn.exec_driver_sql(ddl.replace(f"CREATE TABLE {table.name} ",
                                                 f"CREATE TABLE {table.name}_new ", 1))
                columns = ", ".join(column.name for column in table.columns)
                conn.exec_driver_sql(f"INSERT INTO {table.name}_new ({columns}) "
                                     f"SELECT {columns} FROM {table.name}")
                conn.exec_driver_sql(f"DROP TABLE {table.name}")
                conn.exec_driver_sql(f"ALTER TABLE {table.name}_new RENAME TO {table.name}")
                for index in table.indexes:
                    conn.exec_driver_sql(str(CreateIndex(index, if_not_exists=True).compile(
                        dialect=conn.dialect)))
            for statement in _SQLITE_SEARCH:  # the triggers went with the tables
                if statement.startswith("CREATE TRIGGER"):
                    conn.exec_driver_sql(statement)
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
            if broken:
                raise RuntimeError(f"rebuilding the tables broke foreign keys: {broken[:5]}")
            conn.exec_driver_sql("COMMIT")
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
    return True


def _ids_never_reused(conn: Connection) -> None:
    """Nothing to do in the migrations' transaction: PostgreSQL's sequences never reuse ids,
    and an older SQLite database is rebuilt after it (_sqlite_ids_never_reused, which checks
    the schema itself)."""


# Named, ordered, idempotent; each runs once and is recorded in the migrations table.
MIGRATIONS: tuple[tuple[str, Callable[[Connection], None]], ...] = (
    ("001_create_chat_and_message", _create_tables),
    ("002_chat_window_start", _add_window_start),
    ("003_chat_owner", _add_owner),
    ("004_message_tree", _message_tree),
    ("005_search_and_pins", _search_and_pins),
    ("006_ids_never_reused", _ids_never_reused),
)


def enable_wal(dbapi_conn, _record) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a crash of the app loses
    # nothing and the database never corrupts; a power cut may lose the last commits. FULL
    # cost a turn an fsync (11-13 ms here) before its first token.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


# Any constant: the key of the lock that lets one node at a time migrate a PostgreSQL database.
_MIGRATION_LOCK = 0x7265616D65  # "reame"


def migrate(engine: Engine) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied.

    One transaction. On PostgreSQL, nodes starting together take turns (an advisory lock held
    to the commit): the second finds the first's migrations recorded; a failed step applies
    nothing (its DDL is transactional too)."""
    applied: list[str] = []
    with engine.begin() as conn:
        real = "REAL"
        if is_postgres(conn):
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            real = "DOUBLE PRECISION"  # PostgreSQL's REAL is 4 bytes: minutes, not seconds
        conn.execute(text(
            f"CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at {real})"
        ))
        done = {row[0] for row in conn.execute(text("SELECT name FROM migrations"))}
        for name, step in MIGRATIONS:
            if name in done:
                continue
            step(conn)
            conn.execute(text("INSERT INTO migrations VALUES (:n, :t)"),
                         {"n": name, "t": time.time()})
            applied.append(name)
    if engine.dialect.name == "sqlite" and _sqlite_ids_never_reused(engine):
        applied.append("006_ids_never_reused (tables rebuilt)")
    return applied
