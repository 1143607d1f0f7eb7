"""Chats and messages in SQLite through sqlmodel. The only module that knows SQL."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


class MessageNotFound(LookupError):
    """The chat has no message with this id."""

    def __init__(self, message_id: object):
        super().__init__(f"message {message_id} is not in this chat")
        self.message_id = message_id


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
    # The last message of the branch shown (None: no message yet). Messages form a tree: an
    # edit or a retry adds a version beside the old one, which stays.
    leaf_id: int | None = None
    # The chat this one was branched from ("Branch from here"): its KV file serves the
    # history they share.
    branched_from: int | None = None
    pinned: bool = False  # shown at the top of the chat list


class Message(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    chat_id: int = Field(foreign_key="chat.id", index=True)
    # The message this one follows (None: the chat's first). Versions share a parent.
    parent_id: int | None = Field(default=None, index=True)
    position: int  # depth in the tree: 0 for the first message
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
    if "window_start" not in _columns(conn, "chat"):  # a database made before the column existed
        conn.execute(text("ALTER TABLE chat ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0"))


def _add_owner(conn: Connection) -> None:
    if "owner" not in _columns(conn, "chat"):
        conn.execute(text("ALTER TABLE chat ADD COLUMN owner VARCHAR"))
        conn.execute(text("CREATE INDEX IF NOT EXISTS ix_chat_owner ON chat (owner)"))


def _columns(conn: Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(text(f"PRAGMA table_info({table})"))}


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
_SEARCH_TABLES = (
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


def _search_and_pins(conn: Connection) -> None:
    """Chats can be pinned and searched: the search tables filled from what is stored."""
    if "pinned" not in _columns(conn, "chat"):
        conn.execute(text("ALTER TABLE chat ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT 0"))
    for statement in _SEARCH_TABLES:
        conn.execute(text(statement))
    conn.execute(text("DELETE FROM message_fts"))
    conn.execute(text("INSERT INTO message_fts (rowid, content, chat_id) "
                      "SELECT id, content, chat_id FROM message"))
    conn.execute(text("DELETE FROM chat_fts"))
    conn.execute(text("INSERT INTO chat_fts (rowid, title) SELECT id, title FROM chat"))


# Named, ordered, idempotent; each runs once and is recorded in the migrations table.
MIGRATIONS: tuple[tuple[str, Callable[[Connection], None]], ...] = (
    ("001_create_chat_and_message", _create_tables),
    ("002_chat_window_start", _add_window_start),
    ("003_chat_owner", _add_owner),
    ("004_message_tree", _message_tree),
    ("005_search_and_pins", _search_and_pins),
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

    def has_chat(self, chat_id: int) -> bool:
        if not _storable_id(chat_id):
            return False
        with self._session() as session:
            return session.get(Chat, chat_id) is not None

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
        query = _match_query(words)
        if not query:
            return []
        owned = "c.owner = :owner" if owner is not None else "c.owner IS NULL"
        found: dict[int, str] = {}
        with self.engine.connect() as conn:
            titles = conn.execute(text(
                f"SELECT c.id FROM chat_fts JOIN chat AS c ON c.id = chat_fts.rowid "
                f"WHERE chat_fts MATCH :q AND {owned} ORDER BY chat_fts.rowid DESC "
                f"LIMIT :limit"), {"q": query, "owner": owner, "limit": limit})
            found.update((row[0], "") for row in titles)
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

    def add_message(self, chat_id: int, role: str, content: str, *,
                    tokens: Iterable[int] | None = None, tokens_model: str | None = None,
                    stats: dict | None = None, stopped: bool = False,
                    created_at: float | None = None, after: int | None = None) -> Message:
        """A message after `after` (a message id; None: the last of the branch shown); it
        becomes the last of the branch shown."""
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
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
        """Messages of an imported tree, in one transaction: each has key, parent (a key
        before it, or None), role, content, created_at (or None), stopped and stats (dict or
        None). The branch shown ends at the message keyed current (None: the last)."""
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            stored: dict[object, Message] = {}
            for m in messages:
                parent = stored.get(m.parent) if m.parent is not None else None
                message = Message(
                    chat_id=chat_id, parent_id=parent.id if parent else None,
                    position=parent.position + 1 if parent else 0, role=m.role,
                    content=m.content, stats=json.dumps(m.stats) if m.stats else None,
                    stopped=m.stopped)
                if m.created_at is not None:
                    message.created_at = m.created_at
                session.add(message)
                session.flush()
                stored[m.key] = message
            leaf = stored.get(current) if current is not None else None
            if leaf is None and stored:
                leaf = list(stored.values())[-1]
            chat.leaf_id = leaf.id if leaf is not None else None
            session.add(chat)
            session.commit()

    def rewind(self, chat_id: int, position: int) -> None:
        """Show the branch only up to the message before position: the next message added
        becomes a new version of the one at position (which stays, as do those after it)."""
        branch = self.messages(chat_id)
        self.update_chat(chat_id, leaf_id=branch[position - 1].id if position > 0 else None)

    def show_version(self, chat_id: int, message_id: int) -> list[Message]:
        """Show the branch through message_id (one of the chat's messages): down to the
        newest message after it. The branch shown."""
        thread = self.thread(chat_id)
        if message_id not in thread.by_id:
            raise MessageNotFound(message_id)
        self.update_chat(chat_id, leaf_id=thread.newest_under(message_id))
        return self.thread(chat_id).branch


MARK, END_MARK = "\x02", "\x03"  # around the matches in a search snippet


@dataclass
class Found:
    """A chat that a search found, with a snippet of a message that matched ("" if only its
    title did)."""

    chat: Chat
    snippet: str


def _match_query(words: str) -> str:
    """An FTS5 query for every word of words, the last as a prefix ("" if none): each word
    quoted, so that nothing a user types is taken as FTS5 syntax."""
    tokens = re.findall(r"\w+", words)[:16]
    if not tokens:
        return ""
    quoted = [f'"{token}"' for token in tokens]
    return " ".join(quoted[:-1] + [quoted[-1] + "*"])


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
