"""A chat's rows inside one of Store's sessions (database.py): a message appended, a reply
written as it streamed completed, the chat locked for the write."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from sqlmodel import Session

from reame.chats.messages import Role
from reame.chats.store.tables import ANY_OWNER, Chat, Message, MessageNotFound
from reame.config.refusals import ChatNotFound


def append(session: Session, chat: Chat, *, role: str, content: str,
           tokens: Iterable[int] | None = None, tokens_model: str | None = None,
           stats: dict | None = None, stopped: bool = False, created_at: float | None = None,
           after: int | None = None, tool_calls: list[dict] | None = None,
           tool_call_id: str | None = None) -> Message:
    """Add a message to chat (locked in session) after `after` (None: the chat's leaf), as
    the chat's new leaf (Store.add_message); the caller commits. tool_calls: a reply's calls
    (each {"id", "name", "arguments"}); tool_call_id: the call a "tool" message answers."""
    parent_id = after if after is not None else chat.leaf_id
    parent = session.get(Message, parent_id) if parent_id is not None else None
    if parent is not None and parent.chat_id != chat.id:
        raise MessageNotFound(parent_id)
    message = Message(
        chat_id=chat.id, parent_id=parent.id if parent else None,
        position=parent.position + 1 if parent else 0, role=role,
        content=content, tokens=json.dumps(list(tokens)) if tokens is not None else None,
        tokens_model=tokens_model, stats=json.dumps(stats) if stats else None,
        stopped=stopped, tool_calls=json.dumps(tool_calls) if tool_calls else None,
        tool_call_id=tool_call_id,
    )
    if created_at is not None:
        message.created_at = created_at
    session.add(message)
    session.flush()
    chat.leaf_id = message.id
    chat.updated_at = time.time()
    return message


def complete(session: Session, chat: Chat, message_id: int, *, content: str,
             tokens: Iterable[int] | None, tokens_model: str | None, stats: dict | None,
             stopped: bool, after: int | None, tool_calls: list[dict] | None = None) -> Message:
    """The reply written while it streamed (message_id) as its turn's end writes it: what
    append would have added then, in that row (its place in the tree unchanged), which becomes
    the chat's leaf again. A row gone meanwhile is appended after `after` instead."""
    message = session.get(Message, message_id)
    if message is None or message.chat_id != chat.id:
        return append(session, chat, role=Role.ASSISTANT, content=content, tokens=tokens,
                      tokens_model=tokens_model, stats=stats, stopped=stopped, after=after,
                      tool_calls=tool_calls)
    message.content = content
    message.tool_calls = json.dumps(tool_calls) if tool_calls else None
    message.tokens = json.dumps(list(tokens)) if tokens is not None else None
    message.tokens_model = tokens_model
    message.stats = json.dumps(stats) if stats else None
    message.stopped = stopped
    message.created_at = chat.updated_at = time.time()  # when it was kept, as append's
    session.add(message)
    chat.leaf_id = message.id
    return message


def owned_chat(session: Session, chat_id: int, owner: object) -> Chat:
    """The chat, locked (locked_chat), if it belongs to owner (ANY_OWNER: anyone's)."""
    chat = locked_chat(session, chat_id)
    if chat is None or (owner is not ANY_OWNER and chat.owner != owner):
        raise ChatNotFound(chat_id)
    return chat


def locked_chat(session: Session, chat_id: int) -> Chat | None:
    """The chat, its row locked until the session ends, on a database several processes write
    (PostgreSQL: SELECT ... FOR UPDATE; SQLite has one writer at a time anyway and ignores
    it). Two nodes adding to one chat then take turns: each new message sees the other's as
    the chat's last (no lost leaf_id), and a delete never meets a message added meanwhile."""
    return session.get(Chat, chat_id, with_for_update=True)
