"""A chat's messages as a tree of versions, and the branch shown."""

from __future__ import annotations

from dataclasses import dataclass

from reame.chats.store.tables import Message


@dataclass
class MessageTree:
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
