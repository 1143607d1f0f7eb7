"""Store: the chats of one database (an SQLite file, or a PostgreSQL server several nodes
share), each method its own session; writes of this process taken in turn (WriteGate)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

from sqlalchemy import event, insert, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, create_engine, delete, func, select

from reame.chats.store.message_tree import MessageTree
from reame.chats.store.rows import append, complete, locked_chat, owned_chat
from reame.chats.store.write_gate import WriteGate, writes
from reame.chats.store.migrations import enable_wal, is_postgres, migrate
from reame.chats.store.search import Found, postgres_matches, search_terms, sqlite_matches
from reame.chats.store.tables import (
    ANY_OWNER,
    IMPORT_BATCH,
    Chat,
    DatabaseUnavailable,
    Message,
    MessageNotFound,
    owned_by,
    storable_id,
)
from reame.config.refusals import ChatNotFound


def _server_url(url: str) -> URL:
    """A database server's URL as SQLAlchemy's create_engine takes it: postgresql:// (and
    postgres://) use the psycopg (3) driver, the one Reame installs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


class Store:
    """The chats of one database; every method opens and closes its own session.

    database: the SQLite file (a Path), or a database server's URL (a str: postgresql://...),
    which several Reame processes may share. self.db: SQLAlchemy's engine (its connection
    pool) for that database; not the model's Engine (reame.inference.engine)."""

    def __init__(self, database: Path | str):
        self._gate = WriteGate()
        if isinstance(database, Path):
            database.parent.mkdir(parents=True, exist_ok=True)
            self.path: Path | None = database
            self.db = create_engine(
                f"sqlite:///{database}", connect_args={"check_same_thread": False}
            )
            event.listen(self.db, "connect", enable_wal)
        else:
            self.path = None
            # pre_ping: a connection the server dropped (a restart, a failover) is replaced
            # before use instead of failing a user's action.
            self.db = create_engine(_server_url(database), pool_pre_ping=True,
                                    connect_args={"application_name": "reame",
                                                  "connect_timeout": 10})
            self._reach()
        migrate(self.db)

    @property
    def where(self) -> str:
        """The database, for messages: its file, or its URL without the password."""
        return str(self.path) if self.path else self.db.url.render_as_string(
            hide_password=True)

    def _reach(self) -> None:
        """Connect once; DatabaseUnavailable says why not (a server down, a wrong password)."""
        try:
            with self.db.connect():
                pass
        except OperationalError as exc:
            reason = str(exc.orig or exc).strip().splitlines()[0]
            raise DatabaseUnavailable(f"cannot use the database {self.where}: {reason}") from None

    def _session(self) -> Session:
        return Session(self.db, expire_on_commit=False)

    # chats

    @writes
    def create_chat(self, *, title: str, system_prompt: str, temperature: float,
                    top_p: float, max_tokens: int, owner: str | None = None,
                    branched_from: int | None = None,
                    created_at: float | None = None) -> Chat:
        """A new chat; created_at: when it began, for an imported one (else now)."""
        dates = {} if created_at is None else {"created_at": created_at,
                                                "updated_at": created_at}
        chat = Chat(title=title, system_prompt=system_prompt, temperature=temperature,
                    top_p=top_p, max_tokens=max_tokens, owner=owner,
                    branched_from=branched_from, **dates)
        with self._session() as session:
            session.add(chat)
            session.commit()
        return chat

    def get_chat(self, chat_id: int) -> Chat:
        if not storable_id(chat_id):
            raise ChatNotFound(chat_id)
        with self._session() as session:
            chat = session.get(Chat, chat_id)
        if chat is None:
            raise ChatNotFound(chat_id)
        return chat

    def has_chat(self, chat_id: int, owner: object = ANY_OWNER) -> bool:
        """Whether the chat exists (and belongs to owner, if one is given: None is the
        owner of chats made without accounts)."""
        if not storable_id(chat_id):
            return False
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            return chat is not None and (owner is ANY_OWNER or chat.owner == owner)

    def list_chats(self, owner: str | None = None, limit: int | None = None, *,
                   archived: bool | None = None) -> list[Chat]:
        """The owner's chats (None: the chats made without accounts): pinned ones first, then
        the most recently active first; the first limit of them (None: all). archived: only
        the archived ones (True) or the others (False); None: all."""
        with self._session() as session:
            query = select(Chat).where(owned_by(owner))
            if archived is not None:
                query = query.where(Chat.archived == archived)
            query = query.order_by(Chat.pinned.desc(), Chat.updated_at.desc(), Chat.id.desc())
            return list(session.exec(query.limit(limit) if limit is not None else query))

    def search(self, owner: str | None, words: str, limit: int = 50) -> list[Found]:
        """The owner's chats whose title or messages hold every word of `words` (the last one
        may be the start of a word), each with a snippet of its newest matching message (its
        matches between MARK and END_MARK; "" if only the title matched): those with the
        newest matches, at most limit, pinned first, then the most recently active first.

        The index is read newest match first and left as soon as limit chats are found, so
        a word in every chat costs no more than a rare one."""
        terms = search_terms(words)
        if not terms:
            return []
        with self.db.connect() as conn:
            find = postgres_matches if is_postgres(conn) else sqlite_matches
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
        query = select(Chat).where(owned_by(owner))
        if active:  # the page opens on it: not an archived one
            query = query.where(Chat.archived == False)  # noqa: E712 - SQL, not Python
        with self._session() as session:
            return session.exec(query.order_by(*order).limit(1)).first()

    def count_chats(self, owner: str | None = None, *, archived: bool | None = None) -> int:
        """How many chats the owner has (None: chats made without accounts); archived: only
        the archived ones (True) or the others (False); None: all."""
        query = select(func.count()).select_from(Chat).where(owned_by(owner))
        if archived is not None:
            query = query.where(Chat.archived == archived)
        with self._session() as session:
            return session.exec(query).one()

    def owners(self) -> dict[str | None, int]:
        """How many chats each owner has (None: the chats made without accounts), for the
        admin's list of users and of chats left by removed ones."""
        query = select(Chat.owner, func.count()).group_by(Chat.owner)
        with self._session() as session:
            return dict(session.exec(query).all())

    @writes
    def give_chats(self, owner: str | None, to: str) -> int:
        """Move every chat of owner (None: the chats made without accounts) to `to`; the
        number moved."""
        with self._session() as session:
            chats = list(session.exec(select(Chat).where(owned_by(owner))))
            for chat in chats:
                chat.owner = to
                session.add(chat)
            session.commit()
            return len(chats)

    def update_chat(self, chat_id: int, *, expect_owner: object = ANY_OWNER, **fields) -> Chat:
        """expect_owner: the chat must (still) belong to them, checked in the write's
        transaction (ChatNotFound otherwise)."""
        return self.write_turn(chat_id, expect_owner=expect_owner, **fields)[0]

    @writes
    def write_turn(self, chat_id: int, *, expect_owner: object = ANY_OWNER,
                   message: dict | list[dict] | None = None,
                   **fields) -> tuple[Chat, Message | list[Message] | None]:
        """The chat's fields changed (as update_chat), then a message added (message: the
        arguments of add_message after chat_id; a list: several, one after the other; None
        for none), in one transaction: what a turn writes at one moment (turns.py). The chat,
        and the message added (a list of them for a list)."""
        with self._session() as session:
            chat = owned_chat(session, chat_id, expect_owner)
            for name, value in fields.items():
                if not hasattr(Chat, name) or name in ("id", "created_at"):
                    raise AttributeError(f"Chat has no editable field {name!r}")
                setattr(chat, name, value)
            listed = message if isinstance(message, list) else [message] if message else []
            added = [append(session, chat, **m) for m in listed]
            session.add(chat)
            session.commit()
        return chat, added if isinstance(message, list) else added[0] if added else None

    @writes
    def put_leaf_back(self, chat_id: int, *, shown: int | None, back_to: int,
                      expect_owner: object = ANY_OWNER) -> bool:
        """Show the branch ending at back_to again, if the chat still shows the one ending at
        shown (checked in the write's transaction: a message added meanwhile stays shown).
        Whether it was put back."""
        with self._session() as session:
            chat = owned_chat(session, chat_id, expect_owner)
            if chat.leaf_id != shown:
                return False
            chat.leaf_id = back_to
            session.add(chat)
            session.commit()
            return True

    def touch(self, chat_id: int) -> None:
        self.update_chat(chat_id, updated_at=time.time())

    @writes
    def retitle(self, chat_id: int, old: str, new: str) -> bool:
        """Give the chat the title new if its title is still old (in one transaction: a
        rename meanwhile wins); whether it did. Its updated time stays."""
        with self._session() as session:
            chat = locked_chat(session, chat_id)
            if chat is None or chat.title != old:
                return False
            chat.title = new
            session.add(chat)
            session.commit()
            return True

    @writes
    def delete_chat(self, chat_id: int) -> None:
        with self._session() as session:
            chat = locked_chat(session, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            session.exec(delete(Message).where(Message.chat_id == chat_id))
            session.delete(chat)
            session.commit()

    def chat_ids(self) -> set[int]:
        with self._session() as session:
            return set(session.exec(select(Chat.id)))

    # messages

    def tree(self, chat_id: int) -> MessageTree:
        """The chat's messages, every version, and the branch shown."""
        with self._session() as session:
            chat = session.get(Chat, chat_id)
            if chat is None:
                raise ChatNotFound(chat_id)
            query = select(Message).where(Message.chat_id == chat_id).order_by(Message.id)
            return MessageTree(list(session.exec(query)), chat.leaf_id)

    def messages(self, chat_id: int) -> list[Message]:
        """The branch shown, first message first ([] for an unknown chat)."""
        try:
            return self.tree(chat_id).branch
        except ChatNotFound:
            return []

    def add_message(self, chat_id: int, role: str, content: str, *,
                    expect_owner: object = ANY_OWNER, **fields) -> Message:
        """A message after `after` (a message id; None: the last of the branch shown); it
        becomes the last of the branch shown. fields: rows.append's (tokens, tokens_model,
        stats, stopped, created_at, after, tool_calls, tool_call_id). expect_owner: as
        update_chat."""
        return self.write_turn(chat_id, expect_owner=expect_owner,
                               message=dict(role=role, content=content, **fields))[1]

    @writes
    def write_so_far(self, message_id: int, content: str) -> bool:
        """A reply's text so far, into its row (begun by add_message while it streams: the
        turn's end completes it, end_reply). False if the row is gone (its chat deleted)."""
        with self.db.begin() as conn:
            return conn.execute(update(Message).where(Message.id == message_id).values(
                content=content)).rowcount == 1

    @writes
    def end_reply(self, chat_id: int, message_id: int, content: str, *,
                  expect_owner: object = ANY_OWNER, **fields) -> Message:
        """The reply written while it streamed (message_id) completed as add_message would
        have added it now (fields: its tokens, tokens_model, stats, stopped and after), one
        transaction; the chat's leaf. expect_owner: as update_chat."""
        with self._session() as session:
            chat = owned_chat(session, chat_id, expect_owner)
            message = complete(session, chat, message_id, content=content, **fields)
            session.add(chat)
            session.commit()
        return message

    def copy_messages(self, chat_id: int, messages: list[Message]) -> None:
        """Copies of messages (a branch of another chat), as the branch of chat_id."""
        for m in messages:
            self.add_message(chat_id, m.role, m.content, tokens=m.token_list,
                             tokens_model=m.tokens_model, stats=m.stats_dict,
                             stopped=m.stopped, created_at=m.created_at,
                             tool_calls=m.call_list, tool_call_id=m.tool_call_id)

    def add_tree(self, chat_id: int, messages: Iterable, current: object | None) -> None:
        """Messages of an imported tree: each has key, parent (a key before it, or None),
        role, content, created_at (or None), stopped, stats (dict or None), tool_calls and
        tool_call_id (as append takes them). The branch
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
            with self._gate.write(), self.db.begin() as conn:
                if conn.execute(select(Chat.id).where(Chat.id == chat_id)).first() is None:
                    raise ChatNotFound(chat_id)
                for m in batch:
                    parent = stored.get(m.parent) if m.parent is not None else None
                    row = {"chat_id": chat_id, "parent_id": parent[0] if parent else None,
                           "position": parent[1] + 1 if parent else 0, "role": m.role,
                           "content": m.content, "tokens": None, "tokens_model": None,
                           "stats": json.dumps(m.stats) if m.stats else None,
                           "stopped": m.stopped, "tool_call_id": m.tool_call_id,
                           "tool_calls": json.dumps(m.tool_calls) if m.tool_calls else None,
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
        tree = self.tree(chat_id)
        if message_id not in tree.by_id:
            raise MessageNotFound(message_id)
        self.update_chat(chat_id, leaf_id=tree.newest_under(message_id))
        return self.tree(chat_id).branch

