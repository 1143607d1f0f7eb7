"""The tables: a chat and its messages (a tree of versions), the same on SQLite and
PostgreSQL, and what a write can be refused with."""

from __future__ import annotations

import json
import time

from sqlalchemy import BigInteger, Integer
from sqlalchemy.types import TypeDecorator
from sqlmodel import AutoString, Field, SQLModel

from reame.config.chat_settings import FIELD


def storable_id(chat_id: int) -> bool:
    """Whether chat_id fits a 64-bit integer, SQLite's and PostgreSQL's id (a larger one would
    raise OverflowError)."""
    return -(1 << 63) <= chat_id < (1 << 63)


def owned_by(owner: str | None):
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
# between two batches (write_gate.WriteGate).
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
    archived: bool = False  # out of the chat list; search still finds it


class Message(SQLModel, table=True):
    __table_args__ = _NEVER_REUSED
    id: int | None = Field(default=None, primary_key=True, sa_type=_ID)
    chat_id: int = Field(foreign_key="chat.id", index=True, sa_type=_ID)
    # The message this one follows (None: the chat's first). Versions share a parent.
    parent_id: int | None = Field(default=None, index=True, sa_type=_ID)
    position: int  # depth in the tree: 0 for the first message
    role: str  # messages.Role: "user" | "assistant" | "tool"
    content: str = Field(sa_type=_Text)
    created_at: float = Field(default_factory=time.time)
    # The exact tokens the model generated for an assistant message (JSON list), and the
    # fingerprint of the model they belong to: re-tokenizing the text need not give them back.
    tokens: str | None = None
    tokens_model: str | None = None
    stats: str | None = None  # JSON: the turn's numbers, shown under the reply
    stopped: bool = False
    # A reply's tool calls (JSON list of {"id", "name", "arguments"}: the arguments as the
    # JSON text written), its content the text before them; a "tool" message's content is
    # the result of the call tool_call_id names.
    tool_calls: str | None = Field(default=None, sa_type=_Text)
    tool_call_id: str | None = Field(default=None, sa_type=_Text)

    @property
    def call_list(self) -> list[dict]:
        return json.loads(self.tool_calls) if self.tool_calls else []

    @property
    def token_list(self) -> list[int] | None:
        return json.loads(self.tokens) if self.tokens else None

    @property
    def stats_dict(self) -> dict:
        return json.loads(self.stats) if self.stats else {}


class StoredResponse(SQLModel, table=True):
    """A response of /v1/responses kept for previous_response_id (stored_responses.py): its
    new input items, its output items and the reply's text as the model wrote it (JSON), the
    response it follows, whose it is; bounded per user and expiring."""

    __tablename__ = "stored_response"
    id: str = Field(primary_key=True)  # resp_...
    owner: str | None = Field(default=None, index=True)  # None: made without accounts
    previous_id: str | None = None
    created_at: float = Field(default_factory=time.time, index=True)
    size: int = 0  # bytes of data
    data: str = Field(sa_type=_Text)


class UserInstructions(SQLModel, table=True):
    """A user's custom instructions (instructions.py): how they want the model to answer and
    what it should know about them, for the chats they start. owner "" on a server without
    accounts (a primary key cannot be NULL)."""

    __tablename__ = "user_instructions"
    owner: str = Field(primary_key=True)
    how_to_answer: str = Field(default="", sa_type=_Text)
    about_me: str = Field(default="", sa_type=_Text)
    updated_at: float = Field(default_factory=time.time)
