"""Chats and messages in SQLite through sqlmodel. The only module that knows SQL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Field, Session, SQLModel, create_engine, delete, func, select

from .chat_settings import FIELD


def _storable_id(chat_id: int) -> bool:
    """Whether chat_id fits SQLite's integer (a larger one would raise OverflowError)."""
    return -(1 << 63) <= chat_id < (1 << 63)


def _owned_by(owner: str | None):
    """The chats of owner; None: those made without accounts."""
    return Chat.owner == owner if owner is not None else Chat.owner.is_(None)


class ChatNotFound(LookupError):
    """No chat has this id."""

    def __init__(self, chat_id: object):
        super().__init__(f"chat {chat_id} does not exist")
        self.chat_id = chat_id


class Chat(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    title: str
    # The chat's own settings (chat_settings.ChatSettings).
    system_prompt: str = ""
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


class Message(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    chat_id: int = Field(foreign_key="chat.id", index=True)
    position: int
    role: str  # "user" | "assistant"
    content: str
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
    columns = {row[1] for row in conn.execute(text("PRAGMA table_info(chat)"))}
    if "window_start" not in columns:  # a database made before the column existed
        conn.execute(text("ALTER TABLE chat ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0"))


def _add_owner(conn: Connection) -> None:
    columns = {row[1] for row in conn.execute(text("PRAGMA table_info(chat)"))}
    if "owner" not in columns:
        conn.execute(text("ALTER TABLE chat ADD COLUMN owner VARCHAR"))
        conn.execute(text("CREATE INDEX IF NOT EXISTS ix_chat_owner ON chat (owner)"))


# Named, ordered, idempotent; each runs once and is recorded in the migrations table.
MIGRATIONS: tuple[tuple[str, Callable[[Connection], None]], ...] = (
    ("001_create_chat_and_message", _create_tables),
    ("002_chat_window_start", _add_window_start),
    ("003_chat_owner", _add_owner),
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


def migrate(engine: Engine) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    applied: list[str] = []
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL)"
        ))
        done = {row[0] for row in conn.execute(text("SELECT name FROM migrations"))}
        for name, step in MIGRATIONS:
            if name in done:
                continue
            step(conn)
            conn.execute(text("INSERT INTO migrations VALUES (:n, :t)"),
                         {"n": name, "t": time.time()})
            applied.append(name)
    return applied


class Store:
    """The chats of one database; every method opens and closes its own session."""

    def __init__(self, database_path: Path):
        database_path.parent.mkdir(parents=True, exist_ok=True)
        self.path = database_path
        self.engine = create_engine(
            f"sqlite:///{database_path}", connect_args={"check_same_thread": False}
        )
        event.listen(self.engine, "connect", _enable_wal)
        migrate(self.engine)

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # chats

    def create_chat(self, *, title: str, system_prompt: str, temperature: float,
                    top_p: float, max_tokens: int, owner: str | None = None) -> Chat:
        chat = Chat(title=title, system_prompt=system_prompt, temperature=temperature,
                    top_p=top_p, max_tokens=max_tokens, owner=owner)
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

    def has_chat(self, chat_id: int) -> bool:
        if not _storable_id(chat_id):
            return False
        with self._session() as session:
            return session.get(Chat, chat_id) is not None

    def list_chats(self, owner: str | None = None) -> list[Chat]:
        """The owner's chats (None: the chats made without accounts), most recently active first."""
        with self._session() as session:
            query = select(Chat).where(_owned_by(owner))
            return list(session.exec(query.order_by(Chat.updated_at.desc(), Chat.id.desc())))

    def count_chats(self, owner: str | None = None) -> int:
        """How many chats the owner has (None: chats made without accounts)."""
        with self._session() as session:
            return session.exec(select(func.count()).select_from(Chat)
                                .where(_owned_by(owner))).one()

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

    def update_chat(self, chat_id: int, **fields) -> Chat:
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            for name, value in fields.items():
                if not hasattr(Chat, name) or name in ("id", "created_at"):
                    raise AttributeError(f"Chat has no editable field {name!r}")
                setattr(chat, name, value)
            session.add(chat)
            session.commit()
        return chat

    def touch(self, chat_id: int) -> None:
        self.update_chat(chat_id, updated_at=time.time())

    def delete_chat(self, chat_id: int) -> None:
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            session.exec(delete(Message).where(Message.chat_id == chat_id))
            session.delete(chat)
            session.commit()

    def chat_ids(self) -> set[int]:
        with self._session() as session:
            return set(session.exec(select(Chat.id)))

    # messages

    def messages(self, chat_id: int) -> list[Message]:
        with self._session() as session:
            query = select(Message).where(Message.chat_id == chat_id).order_by(Message.position)
            return list(session.exec(query))

    def add_message(self, chat_id: int, role: str, content: str, *,
                    tokens: Iterable[int] | None = None, tokens_model: str | None = None,
                    stats: dict | None = None, stopped: bool = False) -> Message:
        with self._session() as session:
            if session.get(Chat, chat_id) is None:
                raise ChatNotFound(chat_id)
            last = session.exec(
                select(func.max(Message.position)).where(Message.chat_id == chat_id)
            ).one()
            message = Message(
                chat_id=chat_id, position=(last + 1) if last is not None else 0, role=role,
                content=content, tokens=json.dumps(list(tokens)) if tokens is not None else None,
                tokens_model=tokens_model, stats=json.dumps(stats) if stats else None,
                stopped=stopped,
            )
            session.add(message)
            chat = session.get(Chat, chat_id)
            chat.updated_at = time.time()
            session.add(chat)
            session.commit()
        return message

    def delete_messages_from(self, chat_id: int, position: int) -> int:
        """Delete the messages at position and after; return how many went."""
        with self._session() as session:
            result = session.exec(
                delete(Message).where(Message.chat_id == chat_id, Message.position >= position)
            )
            session.commit()
            return result.rowcount
