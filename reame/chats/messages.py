"""Stored chats as the faces (the page, the named API, /v1) see them: frozen copies of the
store's rows, which stay inside reame/chats (store/). ChatService returns these.

- Role: the names of a stored message's roles, said once.
- ChatMessage: one message (id, role, its text and the documents in it, a reply's tool calls
  or the call a tool's result answers, when it was written, its reply's stats, which version
  it is of how many).
- CalledTool: one tool call of a reply (its id, the function, the arguments' JSON text).
- ChatTree: a chat's messages, every version, and the branch shown.
- ChatInfo: a chat (title, its own settings, where the model's window starts, pinned, ...).
- FoundChat: a chat a search found, with its snippet (the matches between MARK and END_MARK).

The field names are those the named API answers with (/get_chat: "content", "created_at").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final

from reame.chats.documents import Document, split

if TYPE_CHECKING:  # the rows these are made from (not imported at run time: store/ imports Role)
    from reame.chats.store import Chat, Found, Message, MessageTree

MARK, END_MARK = "\x02", "\x03"  # around the matches in a search snippet


class Role:
    """A stored message's role: the person's message, the model's reply, or the result of a
    tool the reply called (sent by the client that ran it)."""

    USER: Final = "user"
    ASSISTANT: Final = "assistant"
    TOOL: Final = "tool"
    ALL: Final = (USER, ASSISTANT, TOOL)


def call_id(prefix: str, index: int) -> str:
    """The id of a reply's call at index, among the calls of a turn whose ids start with
    prefix: the same in the stored chat and in the answer streamed before it was kept."""
    return f"{prefix}{index}"


@dataclass(frozen=True)
class CalledTool:
    """A tool call of a reply: its id (a result names it), the function, the arguments as
    the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    @property
    def shown(self) -> str:
        """The call as people read it: get_weather(city="Paris")."""
        try:
            given = json.loads(self.arguments)
        except ValueError:
            given = None
        if not isinstance(given, dict):
            return f"{self.name}({self.arguments})"
        listed = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}"
                           for key, value in given.items())
        return f"{self.name}({listed})"


@dataclass(frozen=True)
class ChatMessage:
    """A stored message. version of versions: an edit or a retry adds a version beside the
    old ones (version_ids, oldest first, this one included)."""

    id: int
    parent_id: int | None  # the message it follows (None: the chat's first)
    position: int  # depth in the tree: 0 for the first message
    role: str  # Role.USER | Role.ASSISTANT | Role.TOOL
    content: str  # a reply's words (before its calls); a tool's result
    created_at: float
    stats: dict[str, Any] = field(default_factory=dict)  # a reply's turn, as stored ({}: none)
    stopped: bool = False
    version: int = 1
    version_ids: tuple[int, ...] = ()
    tool_calls: tuple[CalledTool, ...] = ()  # the tools a reply called
    tool_call_id: str | None = None  # the call a tool's result answers

    @property
    def versions(self) -> int:
        return max(len(self.version_ids), 1)

    @property
    def parts(self) -> tuple[list[Document], str]:
        """The documents attached to it, and the text typed after them (a user's message);
        a reply's or a tool result's text as it is (its calls: tool_calls)."""
        if self.role != Role.USER:
            return [], self.content
        return split(self.content)

    @classmethod
    def of(cls, row: Message, version_ids: tuple[int, ...] = ()) -> ChatMessage:
        return cls(id=row.id, parent_id=row.parent_id, position=row.position, role=row.role,
                   content=row.content, created_at=row.created_at, stats=row.stats_dict,
                   stopped=row.stopped,
                   version=version_ids.index(row.id) + 1 if version_ids else 1,
                   version_ids=version_ids,
                   tool_calls=tuple(CalledTool(c["id"], c["name"], c["arguments"])
                                    for c in row.call_list),
                   tool_call_id=row.tool_call_id)


@dataclass(frozen=True)
class ChatTree:
    """A chat's messages: every version (oldest first), and the branch shown (first message
    first, up to leaf_id)."""

    messages: tuple[ChatMessage, ...]
    branch: tuple[ChatMessage, ...]
    leaf_id: int | None

    @classmethod
    def of(cls, tree: MessageTree) -> ChatTree:
        made = {m.id: ChatMessage.of(m, tuple(tree.versions(m))) for m in tree.messages}
        return cls(tuple(made.values()), tuple(made[m.id] for m in tree.branch), tree.leaf_id)


@dataclass(frozen=True)
class ChatInfo:
    """A chat: its title, its own settings (chat_settings.ChatSettings.of reads them), where
    the model's window starts (a message position), its place in the list."""

    id: int
    title: str
    system_prompt: str
    temperature: float
    top_p: float
    max_tokens: int
    window_start: int
    owner: str | None  # None: made without accounts
    created_at: float
    updated_at: float
    leaf_id: int | None  # the last message of the branch shown (None: no message yet)
    branched_from: int | None  # the chat it was branched from ("Branch from here")
    pinned: bool
    archived: bool

    @classmethod
    def of(cls, row: Chat) -> ChatInfo:
        return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class FoundChat:
    """A chat a search found, with a snippet of a message that matched, its matches between
    MARK and END_MARK ("" if only its title did)."""

    chat: ChatInfo
    snippet: str

    @classmethod
    def of(cls, found: Found) -> FoundChat:
        return cls(ChatInfo.of(found.chat), found.snippet)
