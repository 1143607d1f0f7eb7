"""Chats and messages through sqlmodel, in SQLite (one file, the default) or PostgreSQL
([storage] database_url: several Reame nodes share it). The only module that knows SQL.

The tables, the queries and the migrations are the same on both; what differs is said where it
does: SQLite's PRAGMAs (WAL), and search (SQLite's FTS5 tables kept by triggers; PostgreSQL's
tsvector columns with GIN indexes). A dialect-specific step names its dialect.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from sqlalchemy import BigInteger, Integer, event, insert, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.types import TypeDecorator
from sqlmodel import AutoString, Field, Session, SQLModel, create_engine, delete, func, select

from reame.config.chat_settings import FIELD
from reame.config.refusals import ChatNotFound


def _storable_id(chat_id: int) -> bool:
    """Whether chat_id fits a 64-bit integer, SQLite's and PostgreSQL's id (a larger one would
    raise OverflowError)."""
    return -(1 << 63) <= chat_id < (1 << 63)


def _owned_by(owner: str | None):
    """The chats of owner; None: those made without accounts."""
    return Chat.owner == owner if owner is not None else Chat.owner.is_(None)


class DatabaseUnavailable(Exception):
    """The database server ([storage] database_url) cannot be reached or refuses the login."""



class MessageNotFound(LookupError):
    """The chat has no message with this id."""

    def __init__(self, message_id: object):
        super().__init__(f"message {message_id} is not in this chat")
        self.message_id = message_id


# Ids: SQLite's INTEGER is 64-bit (and must stay INTEGER to be the rowid); PostgreSQL's is
# 32-bit, so there they are BIGINT, the same range.
_ID = Integer().with_variant(BigInteger(), "postgresql")


class _Text(TypeDecorator):
    """A text column. PostgreSQL's text cannot hold NUL (SQLite's can): there a NUL is stored
    as U+FFFD rather than failing the whole write (a reply, an import)."""

    impl = AutoString
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and dialect.name == "postgresql" and "\x00" in value:
            return value.replace("\x00", "\ufffd")
        return value


# An import is written IMPORT_BATCH messages per transaction; the writes waiting meanwhile go
# between two batches (_WriteGate).
IMPORT_BATCH = 100
ANY_OWNER = object()  # a write that need not check whose the chat is (an admin's, a migration's)

# Ids are never reused (SQLite: AUTOINCREMENT; PostgreSQL's sequences never go back): a reply,
# a KV file or a link that outlives its chat cannot land in a later chat given the same id.
_NEVER_REUSED = {"sqlite_autoincrement": True}


class Chat(SQLModel, table=True):
    __table_args__ = _NEVER_REUSED
    id: int | None = Field(default=None, primary_key=True, sa_type=_ID)
    title: str = Field(sa_type=_Text)
    # The chat's own settings (chat_settings.ChatSettings).
    system_prompt: str = Field(default="", sa_type=_Text)
    temperature: float = FIELD["temperature"].default
    top_p: float = FIELD["top_p"].default
    max_tokens: int = FIELD["max_tokens"].default
    # Position of the first message the model still sees: the ones before it no longer fit
    # in its context (they stay here and in the page).
    window_start: int = 0
    # The user the chat belongs to (None: made without accounts). Only they can see it.
    owner: str | None = Field(default=None, index=True)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time, index=True)
    # The last message of the branch shown (None: no message yet). Messages form a tree: an
    # edit or a retry adds a version beside the old one, which stays.
    leaf_id: int | None = Field(default=None, sa_type=_ID)
    # The chat this one was branched from ("Branch from here"): its KV file serves the
    # history they share.
    branched_from: int | None = Field(default=None, sa_type=_ID)
    pinned: bool = False  # shown at the top of the chat list


class Message(SQLModel, table=True):
    __table_args__ = _NEVER_REUSED
    id: int | None = Field(default=None, primary_key=True, sa_type=_ID)
    chat_id: int = Field(foreign_key="chat.id", index=True, sa_type=_ID)
    # The message this one follows (None: the chat's first). Versions share a parent.
    parent_id: int | None = Field(default=None, index=True, sa_type=_ID)
    position: int  # depth in the tree: 0 for the first message
    role: str  # "user" | "assistant"
    content: str = Field(sa_type=_Text)
    created_at: float = Field(default_factory=time.time)
    # The exact tokens the model generated for an assistant message (JSON list), and the
    # fingerprint of the model they belong to: re-tokenizing the text need not give them back.
    tokens: str | None = None
    tokens_model: str | None = None
    stats: str | None = None  # JSON: the turn's numbers, shown under the reply
    stopped: bool = False

    @property
    def token_list(self) -> list[int] | None:
        return json.loads(self.tokens) if self.tokens else None

    @property
    def stats_dict(self) -> dict:
        return json.loads(self.stats) if self.stats else {}


def _create_tables(conn: Connection) -> None:
    SQLModel.metadata.create_all(conn)


def _add_window_start(conn: Connection) -> None:
    if "window_start" not in _columns(conn, "chat"):  # a database made before the column existed
        conn.execute(text("ALTER TABLE chat ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0"))


def _postgres(conn: Connection) -> bool:
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
_TS_CONFIG = "reame_search"
_TS_DOCUMENT = f"to_tsvector('{_TS_CONFIG}', translate({{column}}, '.@/:', '    '))"
_POSTGRES_SEARCH = (
    "CREATE EXTENSION IF NOT EXISTS unaccent",
    f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = '{_TS_CONFIG}') "
    f"THEN CREATE TEXT SEARCH CONFIGURATION {_TS_CONFIG} (COPY = simple); "
    f"ALTER TEXT SEARCH CONFIGURATION {_TS_CONFIG} ALTER MAPPING FOR asciiword, asciihword, "
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
        false = "false" if _postgres(conn) else "0"
        conn.execute(text(f"ALTER TABLE chat ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT {false}"))
    if _postgres(conn):
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


def _enable_wal(dbapi_conn, _record) -> None:
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
        if _postgres(conn):
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


def _server_url(url: str) -> URL:
    """A database server's URL as the engine takes it: postgresql:// (and postgres://) use the
    psycopg (3) driver, the one Reame installs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


class _WriteGate:
    """One write of this process at a time, taken in turn. SQLite writes one transaction at a
    time and a writer that finds it busy polls, sleeping longer and longer: between the
    batches of a long import it would rarely get in (another user's "New chat" waited
    seconds). Writers queue here instead, and the import lets the waiting ones go first."""

    def __init__(self):
        self._lock = threading.RLock()
        self._waiting = 0
        self._count = threading.Lock()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._count:
            self._waiting += 1
        self._lock.acquire()
        with self._count:
            self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def let_others_in(self, at_most_s: float = 1.0) -> None:
        """Wait (holding nothing) until the writes waiting now have started."""
        deadline = time.monotonic() + at_most_s
        while self._waiting and time.monotonic() < deadline:
            time.sleep(0.001)


def _writes(method):
    """A Store method that writes: through the store's write gate."""
    @functools.wraps(method)
    def gated(self, *args, **kwargs):
        with self._gate.write():
            return method(self, *args, **kwargs)
    return gated


class Store:
    """The chats of one database; every method opens and closes its own session.

    database: the SQLite file (a Path), or a database server's URL (a str: postgresql://...),
    which several Reame processes may share."""

    def __init__(self, database: Path | str):
        self._gate = _WriteGate()
        if isinstance(database, Path):
            database.parent.mkdir(parents=True, exist_ok=True)
            self.path: Path | None = database
            self.engine = create_engine(
                f"sqlite:///{database}", connect_args={"check_same_thread": False}
            )
            event.listen(self.engine, "connect", _enable_wal)
        else:
            self.path = None
            # pre_ping: a connection the server dropped (a restart, a failover) is replaced
            # before use instead of failing a user's action.
            self.engine = create_engine(_server_url(database), pool_pre_ping=True,
                                        connect_args={"application_name": "reame",
                                                      "connect_timeout": 10})
            self._reach()
        migrate(self.engine)

    @property
    def where(self) -> str:
        """The database, for messages: its file, or its URL without the password."""
        return str(self.path) if self.path else self.engine.url.render_as_string(
            hide_password=True)

    def _reach(self) -> None:
        """Connect once; DatabaseUnavailable says why not (a server down, a wrong password)."""
        try:
            with self.engine.connect():
                pass
        except OperationalError as exc:
            reason = str(exc.orig or exc).strip().splitlines()[0]
            raise DatabaseUnavailable(f"cannot use the database {self.where}: {reason}") from None

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # chats

    @_writes
    def create_chat(self, *, title: str, system_prompt: str, temperature: float,
                    top_p: float, max_tokens: int, owner: str | None = None,
                    branched_from: int | None = None) -> Chat:
        chat = Chat(title=title, system_prompt=system_prompt, temperature=temperature,
                    top_p=top_p, max_tokens=max_tokens, owner=owner,
                    branched_from=branched_from)
        with self._session() as session:
            session.add(chat)
            session.commit()
        return chat

    def get_chat(self, chat_id: int) -> Chat:
        if not _storable_id(chat_id):
            raise ChatNotFound(chat_id)
        with self._session() as session:
            chat = session.get(Chat, chat_id)
        if chat is None:
            raise ChatNotFound(chat_id)
        return chat

    def has_chat(self, chat_id: int, owner: object = ANY_OWNER) -> bool:
        """Whether the chat exists (and belongs to owner, if one is given: None is the
        owner of chats made without accounts)."""
        if not _storable_id(chat_id):
            return False
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            return chat is not None and (owner is ANY_OWNER or chat.owner == owner)

    def list_chats(self, owner: str | None = None, limit: int | None = None) -> list[Chat]:
        """The owner's chats (None: the chats made without accounts): pinned ones first, then
        the most recently active first; the first limit of them (None: all)."""
        with self._session() as session:
            query = select(Chat).where(_owned_by(owner)).order_by(
                Chat.pinned.desc(), Chat.updated_at.desc(), Chat.id.desc())
            return list(session.exec(query.limit(limit) if limit is not None else query))

    def search(self, owner: str | None, words: str, limit: int = 50) -> list[Found]:
        """The owner's chats whose title or messages hold every word of `words` (the last one
        may be the start of a word), each with a snippet of its newest matching message (its
        matches between MARK and END_MARK; "" if only the title matched): those with the
        newest matches, at most limit, pinned first, then the most recently active first.

        The index is read newest match first and left as soon as limit chats are found, so
        a word in every chat costs no more than a rare one."""
        terms = _search_terms(words)
        if not terms:
            return []
        with self.engine.connect() as conn:
            find = _postgres_matches if _postgres(conn) else _sqlite_matches
            found = find(conn, owner, terms, limit)
        if not found:
            return []
        with self._session() as session:
            chats = list(session.exec(select(Chat).where(Chat.id.in_(list(found)))))
        chats.sort(key=lambda c: (not c.pinned, -c.updated_at, -c.id))
        return [Found(chat, found[chat.id]) for chat in chats[:limit]]

    def newest_chat(self, owner: str | None = None, *, active: bool = False) -> Chat | None:
        """The owner's chat made last, or (active) the most recently active, pinned or not
        (None if they have none)."""
        order = (Chat.updated_at.desc(), Chat.id.desc()) if active else (Chat.id.desc(),)
        with self._session() as session:
            return session.exec(select(Chat).where(_owned_by(owner))
                                .order_by(*order).limit(1)).first()

    def count_chats(self, owner: str | None = None) -> int:
        """How many chats the owner has (None: chats made without accounts)."""
        with self._session() as session:
            return session.exec(select(func.count()).select_from(Chat)
                                .where(_owned_by(owner))).one()

    @_writes
    def give_chats(self, owner: str | None, to: str) -> int:
        """Move every chat of owner (None: the chats made without accounts) to `to`; the
        number moved."""
        with self._session() as session:
            chats = list(session.exec(select(Chat).where(_owned_by(owner))))
            for chat in chats:
                chat.owner = to
                session.add(chat)
            session.commit()
            return len(chats)

    @_writes
    def update_chat(self, chat_id: int, *, expect_owner: object = ANY_OWNER, **fields) -> Chat:
        """expect_owner: the chat must (still) belong to them, checked in the write's
        transaction (ChatNotFound otherwise)."""
        with self._session() as session:
            chat = _owned_chat(session, chat_id, expect_owner)
            for name, value in fields.items():
                if not hasattr(Chat, name) or name in ("id", "created_at"):
                    raise AttributeError(f"Chat has no editable field {name!r}")
                setattr(chat, name, value)
            session.add(chat)
            session.commit()
        return chat

    def touch(self, chat_id: int) -> None:
        self.update_chat(chat_id, updated_at=time.time())

    @_writes
    def delete_chat(self, chat_id: int) -> None:
        with self._session() as session:
            chat = _locked_chat(session, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            session.exec(delete(Message).where(Message.chat_id == chat_id))
            session.delete(chat)
            session.commit()

    def chat_ids(self) -> set[int]:
        with self._session() as session:
            return set(session.exec(select(Chat.id)))

    # messages

    def thread(self, chat_id: int) -> Thread:
        """The chat's messages, every version, and the branch shown."""
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            query = select(Message).where(Message.chat_id == chat_id).order_by(Message.id)
            return Thread(list(session.exec(query)), chat.leaf_id)

    def messages(self, chat_id: int) -> list[Message]:
        """The branch shown, first message first ([] for an unknown chat)."""
        try:
            return self.thread(chat_id).branch
        except ChatNotFound:
            return []

    @_writes
    def add_message(self, chat_id: int, role: str, content: str, *,
                    tokens: Iterable[int] | None = None, tokens_model: str | None = None,
                    stats: dict | None = None, stopped: bool = False,
                    created_at: float | None = None, after: int | None = None,
                    expect_owner: object = ANY_OWNER) -> Message:
        """A message after `after` (a message id; None: the last of the branch shown); it
        becomes the last of the branch shown. expect_owner: as update_chat."""
        with self._session() as session:
            chat = _owned_chat(session, chat_id, expect_owner)
            parent_id = after if after is not None else chat.leaf_id
            parent = session.get(Message, parent_id) if parent_id is not None else None
            if parent is not None and parent.chat_id != chat_id:
                raise MessageNotFound(parent_id)
            message = Message(
                chat_id=chat_id, parent_id=parent.id if parent else None,
                position=parent.position + 1 if parent else 0, role=role,
                content=content, tokens=json.dumps(list(tokens)) if tokens is not None else None,
                tokens_model=tokens_model, stats=json.dumps(stats) if stats else None,
                stopped=stopped,
            )
            if created_at is not None:
                message.created_at = created_at
            session.add(message)
            session.flush()
            chat.leaf_id = message.id
            chat.updated_at = time.time()
            session.add(chat)
            session.commit()
        return message

    def copy_messages(self, chat_id: int, messages: list[Message]) -> None:
        """Copies of messages (a branch of another chat), as the branch of chat_id."""
        for m in messages:
            self.add_message(chat_id, m.role, m.content, tokens=m.token_list,
                             tokens_model=m.tokens_model, stats=m.stats_dict,
                             stopped=m.stopped, created_at=m.created_at)

    def add_tree(self, chat_id: int, messages: Iterable, current: object | None) -> None:
        """Messages of an imported tree: each has key, parent (a key before it, or None),
        role, content, created_at (or None), stopped and stats (dict or None). The branch
        shown ends at the message keyed current (None: the last). Written IMPORT_BATCH
        messages per transaction, so that other writers (other users' turns) get in between
        instead of waiting (or failing: "database is locked"); the chat shows its messages
        (leaf_id) at the end. The caller deletes the chat if this fails part way."""
        table = Message.__table__
        stored: dict[object, tuple[int, int]] = {}  # key -> (id, position)
        last = None
        pending = iter(messages)
        while True:
            batch = list(islice(pending, IMPORT_BATCH))
            if not batch:
                break
            if stored:
                self._gate.let_others_in()
            with self._gate.write(), self.engine.begin() as conn:
                if conn.execute(select(Chat.id).where(Chat.id == chat_id)).first() is None:
                    raise ChatNotFound(chat_id)
                for m in batch:
                    parent = stored.get(m.parent) if m.parent is not None else None
                    row = {"chat_id": chat_id, "parent_id": parent[0] if parent else None,
                           "position": parent[1] + 1 if parent else 0, "role": m.role,
                           "content": m.content, "tokens": None, "tokens_model": None,
                           "stats": json.dumps(m.stats) if m.stats else None,
                           "stopped": m.stopped,
                           "created_at": m.created_at if m.created_at is not None
                           else time.time()}
                    message_id = conn.execute(insert(table).values(row)).inserted_primary_key[0]
                    stored[m.key] = last = (message_id, row["position"])
        leaf = stored.get(current) if current is not None else None
        leaf = leaf or last
        self.update_chat(chat_id, leaf_id=leaf[0] if leaf is not None else None)

    def rewind(self, chat_id: int, position: int, *, expect_owner: object = ANY_OWNER) -> None:
        """Show the branch only up to the message before position: the next message added
        becomes a new version of the one at position (which stays, as do those after it)."""
        branch = self.messages(chat_id)
        self.update_chat(chat_id, leaf_id=branch[position - 1].id if position > 0 else None,
                         expect_owner=expect_owner)

    def show_version(self, chat_id: int, message_id: int) -> list[Message]:
        """Show the branch through message_id (one of the chat's messages): down to the
        newest message after it. The branch shown."""
        thread = self.thread(chat_id)
        if message_id not in thread.by_id:
            raise MessageNotFound(message_id)
        self.update_chat(chat_id, leaf_id=thread.newest_under(message_id))
        return self.thread(chat_id).branch


def _owned_chat(session: Session, chat_id: int, owner: object) -> Chat:
    """The chat, locked (_locked_chat), if it belongs to owner (ANY_OWNER: anyone's)."""
    chat = _locked_chat(session, chat_id)
    if chat is None or (owner is not ANY_OWNER and chat.owner != owner):
        raise ChatNotFound(chat_id)
    return chat


def _locked_chat(session: Session, chat_id: int) -> Chat | None:
    """The chat, its row locked until the session ends, on a database several processes write
    (PostgreSQL: SELECT ... FOR UPDATE; SQLite has one writer at a time anyway and ignores
    it). Two nodes adding to one chat then take turns: each new message sees the other's as
    the chat's last (no lost leaf_id), and a delete never meets a message added meanwhile."""
    return session.get(Chat, chat_id, with_for_update=True)


MARK, END_MARK = "\x02", "\x03"  # around the matches in a search snippet


@dataclass
class Found:
    """A chat that a search found, with a snippet of a message that matched ("" if only its
    title did)."""

    chat: Chat
    snippet: str


def _search_terms(words: str) -> list[str]:
    """The words searched for: runs of letters, digits and _, at most 16."""
    return re.findall(r"\w+", words)[:16]


def _match_query(terms: list[str]) -> str:
    """An FTS5 query for every term, the last as a prefix: each quoted, so that nothing a user
    types is taken as FTS5 syntax."""
    quoted = [f'"{term}"' for term in terms]
    return " ".join(quoted[:-1] + [quoted[-1] + "*"])


def _owned(owner: str | None) -> str:
    """The SQL condition on `c` (the chat) for the owner's chats."""
    return "c.owner = :owner" if owner is not None else "c.owner IS NULL"


def _sqlite_matches(conn: Connection, owner: str | None, terms: list[str],
                    limit: int) -> dict[int, str]:
    """Chat id -> snippet of its newest matching message ("" if only its title matched), for
    at most limit chats of each kind, newest first: through the FTS5 tables."""
    query, owned = _match_query(terms), _owned(owner)
    titles = conn.execute(text(
        f"SELECT c.id FROM chat_fts JOIN chat AS c ON c.id = chat_fts.rowid "
        f"WHERE chat_fts MATCH :q AND {owned} ORDER BY chat_fts.rowid DESC "
        f"LIMIT :limit"), {"q": query, "owner": owner, "limit": limit})
    found = {row[0]: "" for row in titles}
    matches = conn.execute(text(
        f"SELECT message_fts.chat_id, snippet(message_fts, 0, :mark, :end, '…', 12) "
        f"FROM message_fts JOIN chat AS c ON c.id = message_fts.chat_id "
        f"WHERE message_fts MATCH :q AND {owned} ORDER BY message_fts.rowid DESC"),
        {"q": query, "owner": owner, "mark": MARK, "end": END_MARK})
    snippets: dict[int, str] = {}
    for chat_id, snippet in matches:
        if chat_id not in snippets:
            snippets[chat_id] = snippet
            if len(snippets) >= limit:
                break
    matches.close()
    found.update(snippets)
    return found


def _tsquery(terms: list[str]) -> str:
    """A PostgreSQL tsquery for every term, the last as a prefix: each quoted (terms are
    letters, digits and _ only: no quote to escape)."""
    quoted = [f"'{term}'" for term in terms]
    return " & ".join(quoted[:-1] + [quoted[-1] + ":*"])


# ts_headline's options: about FTS5's snippet (12 words around the first match).
_HEADLINE = (f'StartSel="{MARK}", StopSel="{END_MARK}", MaxWords=12, MinWords=6, '
             f'ShortWord=0, MaxFragments=1')


def _postgres_matches(conn: Connection, owner: str | None, terms: list[str],
                      limit: int) -> dict[int, str]:
    """What _sqlite_matches finds, through the tsvector columns. The messages are read newest
    first from a server-side cursor, left as soon as limit chats are found; snippets are made
    for those messages only."""
    query, owned = _tsquery(terms), _owned(owner)
    matching = f"search_vector @@ to_tsquery('{_TS_CONFIG}', :q)"
    titles = conn.execute(text(
        f"SELECT c.id FROM chat AS c WHERE c.{matching} AND {owned} ORDER BY c.id DESC "
        f"LIMIT :limit"), {"q": query, "owner": owner, "limit": limit})
    found = {row[0]: "" for row in titles}
    matches = conn.execution_options(yield_per=256).execute(text(
        f"SELECT m.chat_id, m.id FROM message AS m JOIN chat AS c ON c.id = m.chat_id "
        f"WHERE m.{matching} AND {owned} ORDER BY m.id DESC"), {"q": query, "owner": owner})
    newest: dict[int, int] = {}  # chat id -> its newest matching message
    for chat_id, message_id in matches:
        if chat_id not in newest:
            newest[chat_id] = message_id
            if len(newest) >= limit:
                break
    matches.close()
    if newest:
        snippets = conn.execute(text(
            f"SELECT m.id, m.content, ts_headline('{_TS_CONFIG}', m.content, "
            f"to_tsquery('{_TS_CONFIG}', :q), :options) FROM message AS m "
            f"WHERE m.id = ANY(:ids)"), {"q": query, "options": _HEADLINE,
                                          "ids": list(newest.values())})
        by_message = {message_id: _with_ellipses(content, headline)
                      for message_id, content, headline in snippets}
        found.update((chat_id, by_message[message_id]) for chat_id, message_id in newest.items()
                     if message_id in by_message)  # (not its chat deleted meanwhile)
    return found


def _with_ellipses(content: str, headline: str) -> str:
    """headline (a passage of content, its matches marked) with "…" where content goes on
    before or after it, as FTS5's snippets have."""
    plain = headline.replace(MARK, "").replace(END_MARK, "")
    start = content.find(plain)
    if start < 0:
        return headline
    before = "…" if content[:start].strip() else ""
    after = "…" if content[start + len(plain):].strip() else ""
    return before + headline + after


@dataclass
class Thread:
    """A chat's messages as a tree (by parent_id), and its branch shown (up to leaf_id)."""

    messages: list[Message]  # every version, oldest first
    leaf_id: int | None

    def __post_init__(self):
        self.by_id = {m.id: m for m in self.messages}
        self.children: dict[int | None, list[int]] = {}
        for m in self.messages:
            self.children.setdefault(m.parent_id, []).append(m.id)

    @property
    def branch(self) -> list[Message]:
        """The branch shown, first message first."""
        return self.branch_to(self.leaf_id)

    def branch_to(self, message_id: int | None) -> list[Message]:
        """The messages from the first to message_id, first first."""
        branch, at = [], self.by_id.get(message_id)
        while at is not None:
            branch.append(at)
            at = self.by_id.get(at.parent_id)
        return branch[::-1]

    def version(self, message: Message) -> tuple[int, int]:
        """Which version the message is, and of how many: (1, 1) for a message never edited
        or retried."""
        versions = self.children[message.parent_id]
        return versions.index(message.id) + 1, len(versions)

    def versions(self, message: Message) -> list[int]:
        """The ids of the message's versions (itself included), oldest first."""
        return list(self.children[message.parent_id])

    def newest_under(self, message_id: int) -> int:
        """The id of the newest message in the subtree of message_id (itself if none)."""
        newest, todo = message_id, [message_id]
        while todo:
            at = todo.pop()
            newest = max(newest, at)
            todo.extend(self.children.get(at, ()))
        return newest
