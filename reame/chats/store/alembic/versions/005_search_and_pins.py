"""005_search_and_pins: chats can be pinned and searched, the search filled from what is
stored. SQLite: FTS5 tables kept up to date by triggers; PostgreSQL: generated tsvector
columns with GIN indexes.
"""

import sqlalchemy as sa
from alembic import op

revision = "005_search_and_pins"
down_revision = "004_message_tree"

# Full-text search over titles and messages (SQLite's FTS5), kept up to date by triggers: rows
# are chat and message ids. Diacritics folded: "cafe" finds "café".
SQLITE_SEARCH = (
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
    "DELETE FROM message_fts",
    "INSERT INTO message_fts (rowid, content, chat_id) SELECT id, content, chat_id FROM message",
    "DELETE FROM chat_fts",
    "INSERT INTO chat_fts (rowid, title) SELECT id, title FROM chat",
)

# The same on PostgreSQL: a tsvector column computed from each title and message (generated:
# nothing else to keep up to date, and filled as it is added) with a GIN index. Its
# configuration (reame.chats.store.search.TS_CONFIG) folds case and diacritics like FTS5's
# tokenizer (unaccent, then simple: no stemming, no stop words). Its parser keeps "file.txt",
# "a@b.org" or "2.5" as one word where FTS5 makes two: those characters are read as spaces, so
# that a search for "txt" finds "file.txt" on both.
TS_CONFIG = "reame_search"
_TS_DOCUMENT = f"to_tsvector('{TS_CONFIG}', translate({{column}}, '.@/:', '    '))"
POSTGRES_SEARCH = (
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


def upgrade() -> None:
    bind = op.get_bind()
    if "pinned" not in {column["name"] for column in sa.inspect(bind).get_columns("chat")}:
        op.add_column("chat", sa.Column("pinned", sa.Boolean(), nullable=False,
                                        server_default=sa.false()))
    for statement in POSTGRES_SEARCH if bind.dialect.name == "postgresql" else SQLITE_SEARCH:
        op.execute(statement)


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")
