"""001_create_chat_and_message: the chats and their messages, as the first release made them.

Like every revision here it is idempotent (what exists already is left as it is): on SQLite
DDL is not transactional as pysqlite runs it, so a start cut short may have done part of a
revision without recording it; the next start runs it again.
"""

import sqlalchemy as sa
from alembic import op

revision = "001_create_chat_and_message"
down_revision = None

# Ids: SQLite's INTEGER is 64-bit (and must stay INTEGER to be the rowid); PostgreSQL's is
# 32-bit, so there they are BIGINT (BIGSERIAL for a primary key), the same range.
ID = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    tables = set(sa.inspect(op.get_bind()).get_table_names())
    # On SQLite a new database's ids are AUTOINCREMENT from the start: never given again
    # (006_ids_never_reused rebuilds the tables of the databases made before).
    if "chat" not in tables:
        op.create_table(
            "chat",
            sa.Column("id", ID, primary_key=True),
            sa.Column("title", sa.String(), nullable=False),
            sa.Column("system_prompt", sa.String(), nullable=False),
            sa.Column("temperature", sa.Float(), nullable=False),
            sa.Column("top_p", sa.Float(), nullable=False),
            sa.Column("max_tokens", sa.Integer(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("updated_at", sa.Float(), nullable=False),
            sqlite_autoincrement=True,
        )
        op.create_index("ix_chat_updated_at", "chat", ["updated_at"])
    if "message" not in tables:
        op.create_table(
            "message",
            sa.Column("id", ID, primary_key=True),
            sa.Column("chat_id", ID, sa.ForeignKey("chat.id"), nullable=False),
            sa.Column("position", sa.Integer(), nullable=False),
            sa.Column("role", sa.String(), nullable=False),
            sa.Column("content", sa.String(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("tokens", sa.String(), nullable=True),
            sa.Column("tokens_model", sa.String(), nullable=True),
            sa.Column("stats", sa.String(), nullable=True),
            sa.Column("stopped", sa.Boolean(), nullable=False),
            sqlite_autoincrement=True,
        )
        op.create_index("ix_message_chat_id", "message", ["chat_id"])


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")
