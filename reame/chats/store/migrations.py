"""The schema's migrations, run by Alembic: one revision per step in alembic/versions/, named
and ordered as the runner before it named its steps (001_create_chat_and_message ...); what
differs between SQLite and PostgreSQL is said inside the revision that does it (005: SQLite's
FTS5 tables kept by triggers, PostgreSQL's tsvector columns; 006: SQLite's rebuild for
AUTOINCREMENT). Alembic, a kept library, runs the revisions on both dialects and records the
current one in its alembic_version table; no alembic.ini: it is configured here and runs on
the Store's own engine."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

# Alembic is imported only when a database is not at HEAD (a new one, an upgrade, an old
# runner's): a start on an up-to-date database reads alembic_version with one query and holds
# none of Alembic (11.5 MB, 0.1 s of a start).
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Alembic logs at INFO from its import on ("setup plugin ...") and at every start ("Context impl
# SQLiteImpl."): quiet unless configured otherwise. migrate() logs what it changed, if anything.
if logging.getLogger("alembic").level == logging.NOTSET:
    logging.getLogger("alembic").setLevel(logging.WARNING)

log = logging.getLogger(__name__)

SCRIPTS = Path(__file__).with_name("alembic")  # env.py and versions/
# The newest revision in alembic/versions/ (tests/chats/test_migrations.py checks it is Alembic's
# head): the next revision changes it.
HEAD = "010_user_instructions"


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


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


def alembic_config() -> Config:
    """Alembic's configuration, no alembic.ini: the scripts here, a revision's file named by its
    id. A developer's next revision: alembic.command.revision(config, "what it does",
    rev_id="007_...", autogenerate=True) with the config's sqlalchemy.url set to a database
    at head; autogenerate compares it with the models (tables.py)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.set_main_option("file_template", "%%(rev)s")
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def revisions() -> list[str]:
    """The revisions' ids, oldest first (001-006: the names the runner before Alembic gave its
    steps)."""
    return [script.revision for script in reversed(list(_scripts().walk_revisions()))]


# What the models (tables.py) do not declare: search's FTS5 tables (and their shadow tables)
# on SQLite, its generated columns and GIN indexes on PostgreSQL (revision 005).
_SEARCH = ("chat_fts", "message_fts", "search_vector", "ix_chat_search", "ix_message_search")


def schema_object(_object, name, _type, _reflected, _compare_to) -> bool:
    """Whether a table, column or index is the models' to compare (autogenerate's
    include_object): not search's."""
    return not (name or "").startswith(_SEARCH)


def _sqlite_rebuilt(conn: Connection) -> bool:
    """Whether SQLite's chat ids are AUTOINCREMENT, as revision 006 makes them."""
    sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' "
                               "AND name = 'chat'").scalar()
    return "AUTOINCREMENT" in (sql or "").upper()


def _adopt_old_runner(conn: Connection) -> str | None:
    """A database the runner before Alembic migrated (its `migrations` table names the steps
    done, named as the revisions are): stamped at the last revision those steps complete,
    nothing run again; then that table, replaced by alembic_version, goes. The revision
    stamped, if any. The old runner recorded 006 before its SQLite rebuild ran (after its
    transaction): a database it did not rebuild is stamped at 005, so that 006 runs."""
    tables = set(inspect(conn).get_table_names())
    if "migrations" not in tables:
        return None
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn)
    stamped = None
    if context.get_current_revision() is None:
        done = {name for (name,) in conn.execute(text("SELECT name FROM migrations"))}
        for revision in revisions():
            if revision not in done:
                break
            stamped = revision
        if stamped == "006_ids_never_reused" and not (is_postgres(conn) or _sqlite_rebuilt(conn)):
            stamped = "005_search_and_pins"
        if stamped:
            context.stamp(_scripts(), stamped)
    conn.execute(text("DROP TABLE migrations"))
    return stamped


def _at_head(conn: Connection, target: str) -> bool:
    """Whether the database is at head already: most starts, which then need not import
    Alembic, have it load env.py and read every revision (10 ms a start, a test's Store
    each)."""
    if target != "head" or "alembic_version" not in inspect(conn).get_table_names():
        return False
    versions = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    return versions == {HEAD}


def _upgrade(conn: Connection, target: str, applied: list[str]) -> None:
    """Alembic's upgrade to target on conn; the revisions it applies are added to applied."""
    from alembic import command

    config = alembic_config()
    config.attributes["applied"] = applied
    config.attributes["connection"] = conn
    command.upgrade(config, target)


# Any constant: the key of the lock that lets one node at a time migrate a PostgreSQL database.
_MIGRATION_LOCK = 0x7265616D65  # "reame"


def migrate(engine: Engine, target: str = "head") -> list[str]:
    """Bring the database to Alembic's head (or to the target revision: the tests' older
    databases); return the revisions applied.

    PostgreSQL: one transaction (its DDL is transactional: a failed revision applies nothing),
    and nodes starting together take turns (an advisory lock held to the commit): the second
    finds the first's revisions recorded. SQLite: Alembic's transaction per revision (006
    commits it and runs its rebuild in a transaction of its own), which pysqlite begins only at
    a revision's first write of rows: DDL before it commits as it runs. So every revision is
    idempotent: a start cut short runs the one it was in again."""
    applied: list[str] = []
    with engine.connect() as conn:
        if is_postgres(conn):
            with conn.begin():  # Alembic runs in this transaction: it commits nothing itself
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _MIGRATION_LOCK})
                stamped = _adopt_old_runner(conn)
                if not _at_head(conn, target):
                    _upgrade(conn, target, applied)
        else:
            with conn.begin():
                stamped = _adopt_old_runner(conn)
                done = _at_head(conn, target)
            if not done:
                _upgrade(conn, target, applied)
    if stamped:
        log.info("the migrations table of the runner before Alembic says %s: stamped so",
                 stamped)
    if applied:
        log.info("database migrated: %s", ", ".join(applied))
    return applied
