"""006_ids_never_reused: chat and message ids are never given again, so that a reply, a KV
file or a link that outlives its chat cannot land in a later chat given the same id.

PostgreSQL: nothing to do, its sequences never go back. SQLite: a database made before ids
were AUTOINCREMENT (001 makes new ones so) gets its chat and message tables rebuilt with it, as
SQLite cannot change a primary key in place. The rebuild follows SQLite's documented procedure
for other schema changes: foreign keys off, which SQLite ignores inside a transaction, so it
runs in Alembic's autocommit block (the revisions before it are committed first) with its own
BEGIN IMMEDIATE ... COMMIT and a foreign key check before the commit. The tables are rebuilt
as they are (reflected, plus AUTOINCREMENT), and their indexes and search triggers, dropped
with them, are made again from their saved SQL. (The ids of chats deleted before it left no
trace and may be given once more; nothing of them outlives it: their KV files went with them,
and no turn outlives the restart an upgrade takes.)
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable

revision = "006_ids_never_reused"
down_revision = "005_search_and_pins"

TABLES = ("chat", "message")  # chat first: message refers to it


def _autoincrement(conn: Connection) -> bool:
    """Whether chat's ids are AUTOINCREMENT already (or there is no chat table to rebuild)."""
    sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' "
                               "AND name = 'chat'").scalar()
    return sql is None or "AUTOINCREMENT" in sql.upper()


def _rebuild(conn: Connection) -> None:
    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
    conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        if not _autoincrement(conn):  # asked again under the write lock
            saved = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type IN ('index', 'trigger') "
                "AND tbl_name IN ('chat', 'message') AND sql IS NOT NULL").scalars().all()
            metadata = sa.MetaData()
            for name in TABLES:
                table = sa.Table(name, metadata, autoload_with=conn, sqlite_autoincrement=True)
                ddl = str(CreateTable(table).compile(dialect=conn.dialect)).strip()
                conn.exec_driver_sql(ddl.replace(f"CREATE TABLE {name} ",
                                                 f"CREATE TABLE {name}_new ", 1))
                columns = ", ".join(column.name for column in table.columns)
                conn.exec_driver_sql(f"INSERT INTO {name}_new ({columns}) "
                                     f"SELECT {columns} FROM {name}")
                conn.exec_driver_sql(f"DROP TABLE {name}")
                conn.exec_driver_sql(f"ALTER TABLE {name}_new RENAME TO {name}")
            for statement in saved:  # the indexes and triggers went with the tables
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


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite" or _autoincrement(op.get_bind()):
        return
    with op.get_context().autocommit_block():
        _rebuild(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")
