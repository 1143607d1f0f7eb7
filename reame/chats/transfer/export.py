"""Export: a chat (or all of them) as Reame's JSON document (docs/export-format.md), and a
chat's branch as Markdown."""

from __future__ import annotations

import math
import time
from typing import Any

from reame.chats.messages import Role
from reame.chats.store import Chat, Message, MessageTree
from reame.chats.titles import DEFAULT_TITLE
from reame.chats.transfer.checks import FORMAT_CHAT, FORMAT_CHATS, VERSION
from reame.config.chat_settings import ChatSettings


def export_chat(chat: Chat, tree: MessageTree) -> dict[str, Any]:
    """One chat as a "reame-chat" document: its settings and every version of every message,
    so that importing it gives back the same tree. Tokens stay out: they belong to one model."""
    return {
        "format": FORMAT_CHAT,
        "version": VERSION,
        "title": chat.title,
        "created_at": chat.created_at,
        "updated_at": chat.updated_at,
        "settings": ChatSettings.of(chat).as_dict(),
        "pinned": bool(chat.pinned),
        "archived": bool(chat.archived),
        "current": tree.leaf_id if tree.leaf_id in tree.by_id else None,
        "messages": [_exported_message(m) for m in tree.messages],
    }


def _exported_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.id, "parent": m.parent_id, "role": m.role,
                           "content": m.content, "created_at": m.created_at}
    if m.role == Role.ASSISTANT:
        out["stopped"] = bool(m.stopped)
        # A non-finite number would make the document invalid JSON for other readers.
        stats = {k: v for k, v in m.stats_dict.items()
                 if not (isinstance(v, float) and not math.isfinite(v))}
        out["stats"] = stats or None
        if m.call_list:  # the tools it called
            out["tool_calls"] = m.call_list
    if m.tool_call_id is not None:  # a tool's result: the call it answers
        out["tool_call_id"] = m.tool_call_id
    return out


def export_all(chats: list[tuple[Chat, MessageTree]]) -> dict[str, Any]:
    """Several chats (a user's all) as one "reame-chats" document."""
    return {"format": FORMAT_CHATS, "version": VERSION, "exported_at": time.time(),
            "chats": [export_chat(chat, tree) for chat, tree in chats]}


def to_markdown(chat: Chat, tree: MessageTree) -> str:
    """The branch shown, for people: the title, the system prompt quoted, then each message
    under who wrote it, its text as written (other versions are only mentioned)."""
    sections = [f"# {' '.join(chat.title.split()) or DEFAULT_TITLE}"]
    if chat.system_prompt.strip():
        quoted = "\n".join(f"> {line}".rstrip() for line in chat.system_prompt.splitlines())
        sections.append(f"> **System prompt**\n>\n{quoted}")
    for m in tree.branch:
        calls = [f"*Called {c['name']}({c['arguments']})* (`{c['id']}`)" for c in m.call_list]
        text = [_closed_fence(m.content)] if m.content.strip() else [] if calls else ["*(empty)*"]
        sections.append("\n\n".join([f"---\n\n{_markdown_heading(tree, m)}", *text, *calls]))
    return "\n\n".join(sections) + "\n"


def _markdown_heading(tree: MessageTree, m: Message) -> str:
    notes = []
    version, of = tree.version(m)
    if of > 1:
        notes.append(f"version {version} of {of}")
    if m.stopped:
        notes.append("stopped")
    who = {Role.USER: "**You**", Role.TOOL: f"**Tool result** (`{m.tool_call_id}`)"}.get(
        m.role, "**Assistant**")
    return f"{who} ({', '.join(notes)})" if notes else who


def _closed_fence(text: str) -> str:
    """text, with a code fence it leaves open (a reply stopped mid-code) closed: else the
    fence would swallow the rest of the document."""
    fences = sum(1 for line in text.splitlines() if line.lstrip().startswith("```"))
    return text + "\n```" if fences % 2 else text
