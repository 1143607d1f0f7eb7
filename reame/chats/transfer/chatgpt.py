"""ChatGPT's export (conversations.json): each conversation's user and assistant messages
with text, every branch, as an ImportedChat."""

from __future__ import annotations

import re
from dataclasses import dataclass

from reame.chats.messages import Role
from reame.chats.transfer.checks import (
    HIDDEN,
    CHATGPT_ROLES,
    BadImport,
    ImportedChat,
    ImportedMessage,
    check_size,
    kind_of,
    parents_first,
    read_number,
    read_title,
    shown_value,
)


@dataclass
class _Seen:
    """What a ChatGPT node shows: a message with text."""

    role: str
    text: str
    created_at: float | None
    stopped: bool


def chatgpt_chat(conversation: object) -> ImportedChat:
    """A ChatGPT conversation: its user and assistant messages with text, every branch. The
    nodes without one (the empty root, tool calls' results, hidden context) are left out: what
    followed them follows their nearest ancestor kept."""
    if not isinstance(conversation, dict):
        raise BadImport(f"a conversation is {kind_of(conversation)}, not a JSON object")
    mapping = conversation.get("mapping")
    if not isinstance(mapping, dict):
        raise BadImport('a ChatGPT conversation has its messages in an object, "mapping"')
    parents: dict[str, str | None] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise BadImport(f"node {shown_value(key)} is {kind_of(node)}, not a JSON object")
        parent = node.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise BadImport(f"node {shown_value(key)}: its parent is {kind_of(parent)}, not a node id")
        parents[key] = parent
    for key, parent in parents.items():
        if parent is not None and parent not in parents:
            raise BadImport(f"node {shown_value(key)} names parent {shown_value(parent)}, which is not "
                            "in the conversation")
    messages: list[ImportedMessage] = []
    kept_above: dict[str, str | None] = {}  # node -> itself if kept, else its nearest kept ancestor
    system_prompt = ""
    for key in parents_first(parents, "node"):
        parent = parents[key]
        above = kept_above[parent] if parent is not None else None
        kept_above[key] = above
        seen = _chatgpt_seen(mapping[key].get("message"))
        if seen is None:
            continue
        if seen.role == "system" and not system_prompt:
            system_prompt = seen.text.strip()
        elif seen.role in CHATGPT_ROLES:
            messages.append(ImportedMessage(key, above, seen.role, seen.text, seen.created_at,
                                            seen.stopped))
            kept_above[key] = key
    check_size(len(messages))
    title = conversation.get("title")
    return ImportedChat(
        title=read_title(title if isinstance(title, str) else None),
        settings={"system_prompt": system_prompt},
        created_at=read_number(conversation.get("create_time")), messages=messages,
        current=_chatgpt_current(conversation.get("current_node"), kept_above, messages),
        from_elsewhere=True)


def _chatgpt_current(node: object, kept_above: dict[str, str | None],
                     messages: list[ImportedMessage]) -> str | None:
    """The last message kept of the branch ChatGPT showed (without one: the file's last)."""
    if node is None:
        return messages[-1].key if messages else None
    if not isinstance(node, str) or node not in kept_above:
        raise BadImport(f'its "current_node" {shown_value(node)} is not one of its nodes')
    return kept_above[node]


def _chatgpt_seen(message: object) -> _Seen | None:
    """The role and text of a node's message, or None when it shows nothing (no message, no
    text, hidden). ChatGPT's formats change: a shape not known is a node without text."""
    if not isinstance(message, dict):
        return None
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    metadata = message.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    if not isinstance(role, str) or metadata.get(HIDDEN) is True:
        return None
    text = _chatgpt_text(message.get("content"))
    if not text.strip():
        return None
    finish = metadata.get("finish_details")
    stopped = (role == Role.ASSISTANT and isinstance(finish, dict)
               and finish.get("type") == "interrupted")
    return _Seen(role, text, read_number(message.get("create_time")), stopped)


def _chatgpt_text(content: object) -> str:
    """The text of a message's content: its parts that are texts (images and other objects
    in a multimodal message are left out); code (a tool call) in a fenced block."""
    if not isinstance(content, dict):
        return ""
    parts = content.get("parts")
    texts = [p for p in parts if isinstance(p, str) and p] if isinstance(parts, list) else []
    text = "\n\n".join(texts)
    if content.get("content_type") != "code":
        return text
    if not text and isinstance(content.get("text"), str):
        text = content["text"]
    if not text.strip():
        return ""
    language = content.get("language")
    language = language if isinstance(language, str) and language != "unknown" else ""
    runs = re.findall(r"`{3,}", text)
    fence = "`" * max([3] + [len(run) + 1 for run in runs])
    return f"{fence}{' '.join(language.split())}\n{text.rstrip()}\n{fence}"
