"""Chats in and out of Reame: export to a documented JSON document (one chat, or all of them),
read one back, read ChatGPT's export (conversations.json), and show a chat's branch as Markdown.

Pure functions over what the store holds: nothing here touches the database or a model. The
caller stores what parse_import returns; an imported chat has no KV file until its first turn
builds one. The formats are described in docs/export-format.md.

An import file comes from anywhere: whatever its JSON shape, parse_import returns chats or raises
BadImport with a message for the person who uploaded it, never another exception.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from reame.chats.store import Chat, Message, Thread
from reame.chats.titles import DEFAULT_TITLE, MAX_TITLE, checked_title
from reame.config.chat_settings import FIELD, ChatSettings
from reame.config.refusals import ChatError
from reame.inference.turn import TurnStats

FORMAT_CHAT = "reame-chat"
FORMAT_CHATS = "reame-chats"
VERSION = 1
MAX_CHATS = 5000  # chats in one import
MAX_MESSAGES_PER_CHAT = 10000  # messages of one imported chat, every version counted
ROLES = ("user", "assistant")
HIDDEN = "is_visually_hidden_from_conversation"  # ChatGPT's flag on messages not shown

_TYPE_WORDS = {int: "a whole number", float: "a number", str: "a text", bool: "true or false"}
# The type of each stat shown under a reply (render.stats_text formats them as such).
_STAT_TYPES: dict[str, type] = {f.name: type(f.default) for f in fields(TurnStats)
                                if type(f.default) in _TYPE_WORDS}


class BadImport(ChatError):
    """A file that cannot be imported; the message says what is wrong in it."""


@dataclass
class ImportedMessage:
    key: str  # its id in the file (unique in its chat); parents and `current` name it
    parent: str | None  # the key of the message it follows; None: a first message
    role: str  # "user" | "assistant"
    content: str
    created_at: float | None = None
    stopped: bool = False  # a reply the user stopped
    stats: dict[str, Any] | None = None  # a reply's TurnStats, as stored


@dataclass
class ImportedChat:
    title: str
    settings: dict[str, Any]  # only chat settings (chat_settings.FIELD), each already checked
    created_at: float | None
    messages: list[ImportedMessage]  # every version; each after its parent
    current: str | None  # the key of the last message of the branch shown

    def settings_over(self, defaults: ChatSettings) -> ChatSettings:
        """The chat's settings: the file's over the server's defaults (a file may hold some of
        them, a ChatGPT export only the system prompt). ChatError for a value out of range."""
        return defaults.changed(**self.settings)


# export


def export_chat(chat: Chat, thread: Thread) -> dict[str, Any]:
    """One chat as a "reame-chat" document: its settings and every version of every message,
    so that importing it gives back the same tree. Tokens stay out: they belong to one model."""
    return {
        "format": FORMAT_CHAT,
        "version": VERSION,
        "title": chat.title,
        "created_at": chat.created_at,
        "updated_at": chat.updated_at,
        "settings": ChatSettings.of(chat).as_dict(),
        "current": thread.leaf_id if thread.leaf_id in thread.by_id else None,
        "messages": [_exported_message(m) for m in thread.messages],
    }


def _exported_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.id, "parent": m.parent_id, "role": m.role,
                           "content": m.content, "created_at": m.created_at}
    if m.role == "assistant":
        out["stopped"] = bool(m.stopped)
        # A non-finite number would make the document invalid JSON for other readers.
        stats = {k: v for k, v in m.stats_dict.items()
                 if not (isinstance(v, float) and not math.isfinite(v))}
        out["stats"] = stats or None
    return out


def export_all(chats: list[tuple[Chat, Thread]]) -> dict[str, Any]:
    """Several chats (a user's all) as one "reame-chats" document."""
    return {"format": FORMAT_CHATS, "version": VERSION, "exported_at": time.time(),
            "chats": [export_chat(chat, thread) for chat, thread in chats]}


def to_markdown(chat: Chat, thread: Thread) -> str:
    """The branch shown, for people: the title, the system prompt quoted, then each message
    under who wrote it, its text as written (other versions are only mentioned)."""
    sections = [f"# {' '.join(chat.title.split()) or DEFAULT_TITLE}"]
    if chat.system_prompt.strip():
        quoted = "\n".join(f"> {line}".rstrip() for line in chat.system_prompt.splitlines())
        sections.append(f"> **System prompt**\n>\n{quoted}")
    for m in thread.branch:
        sections.append(f"---\n\n{_markdown_heading(thread, m)}\n\n"
                        f"{_closed_fence(m.content) if m.content.strip() else '*(empty)*'}")
    return "\n\n".join(sections) + "\n"


def _markdown_heading(thread: Thread, m: Message) -> str:
    notes = []
    version, of = thread.version(m)
    if of > 1:
        notes.append(f"version {version} of {of}")
    if m.stopped:
        notes.append("stopped")
    who = "**You**" if m.role == "user" else "**Assistant**"
    return f"{who} ({', '.join(notes)})" if notes else who


def _closed_fence(text: str) -> str:
    """text, with a code fence it leaves open (a reply stopped mid-code) closed: else the
    fence would swallow the rest of the document."""
    fences = sum(1 for line in text.splitlines() if line.lstrip().startswith("```"))
    return text + "\n```" if fences % 2 else text


# import


def parse_import(data: object) -> list[ImportedChat]:
    """The chats of an import file (parsed JSON): a Reame document of one chat or of several,
    or ChatGPT's conversations.json (a list of conversations, or one of them). BadImport,
    saying what is wrong, for anything else."""
    if isinstance(data, list):
        return _chats(data, _chatgpt_chat, "conversation")
    if not isinstance(data, dict):
        raise BadImport("not a Reame or ChatGPT export: the file holds "
                        f"{_kind(data)}, not a JSON object or list")
    form = data.get("format")
    if form == FORMAT_CHAT:
        _check_version(data)
        return [_reame_chat(data)]
    if form == FORMAT_CHATS:
        _check_version(data)
        chats = data.get("chats")
        if not isinstance(chats, list):
            raise BadImport('a Reame export of several chats has them in a list, "chats"')
        return _chats(chats, _reame_chat, "chat")
    if form is None and "mapping" in data:  # one conversation taken out of conversations.json
        return _chats([data], _chatgpt_chat, "conversation")
    if form is None:
        raise BadImport('not a Reame or ChatGPT export: it has no "format" (a Reame export '
                        'says "reame-chat" or "reame-chats") and no ChatGPT "mapping"')
    raise BadImport(f"not a Reame or ChatGPT export: its format is {_shown(form)}, not "
                    f'"{FORMAT_CHAT}" or "{FORMAT_CHATS}"')


def _check_version(doc: dict) -> None:
    version = doc.get("version")
    if version is None:
        raise BadImport("the file does not say which version of the Reame export format it "
                        f'is ("version"; this server reads version {VERSION})')
    if type(version) is not int or version != VERSION:
        raise BadImport(f"this file is version {_shown(version)} of the Reame export format; "
                        f"this server reads version {VERSION}")


def _chats(docs: list, parse: Callable[[object], ImportedChat], noun: str) -> list[ImportedChat]:
    """Each document parsed; an error names the chat it is in (its place and title)."""
    if len(docs) > MAX_CHATS:
        raise BadImport(f"an import holds at most {MAX_CHATS:,} chats; this file has "
                        f"{len(docs):,}")
    chats = []
    for n, doc in enumerate(docs, 1):
        try:
            chats.append(parse(doc))
        except BadImport as e:
            if len(docs) == 1:
                raise
            title = doc.get("title") if isinstance(doc, dict) else None
            named = f" ({_shown(title)})" if isinstance(title, str) and title.strip() else ""
            raise BadImport(f"{noun} {n}{named}: {e}") from None
    return chats


def _reame_chat(doc: object) -> ImportedChat:
    if not isinstance(doc, dict):
        raise BadImport(f"a chat is {_kind(doc)}, not a JSON object")
    if doc.get("format", FORMAT_CHAT) != FORMAT_CHAT:
        raise BadImport(f'a chat\'s format is "{FORMAT_CHAT}", not {_shown(doc.get("format"))}')
    listed = doc.get("messages")
    if not isinstance(listed, list):
        raise BadImport('a chat has its messages in a list, "messages"')
    _check_size(len(listed))
    messages = [_reame_message(n, m) for n, m in enumerate(listed, 1)]
    parents: dict[str, str | None] = {}
    shown: dict[str, str] = {}  # key -> the id as the file writes it
    for m, raw in zip(messages, listed):
        shown[m.key] = _shown(raw["id"])
        if m.key in parents:
            raise BadImport(f"two messages have the id {shown[m.key]}")
        parents[m.key] = m.parent
    for m, raw in zip(messages, listed):
        if m.parent is not None and m.parent not in parents:
            raise BadImport(f"message {shown[m.key]} names parent {_shown(raw['parent'])}, "
                            "which is not in the chat")
    order = {key: n for n, key in enumerate(_parents_first(parents, "message", shown))}
    messages.sort(key=lambda m: order[m.key])
    current = doc.get("current")
    if current is not None and not (_is_id(current) and _key(current) in parents):
        raise BadImport(f'"current" names message {_shown(current)}, which is not in the chat')
    return ImportedChat(
        title=_title(doc.get("title")), settings=_settings(doc.get("settings")),
        created_at=_time(doc.get("created_at"), "the chat's created_at"),
        messages=messages, current=None if current is None else _key(current))


def _reame_message(n: int, m: object) -> ImportedMessage:
    if not isinstance(m, dict):
        raise BadImport(f"message {n} of the list is {_kind(m)}, not a JSON object")
    if not _is_id(m.get("id")):
        raise BadImport(f"message {n} of the list has no id (a whole number or a text)")
    key = _key(m["id"])
    name = f"message {_shown(m['id'])}"
    parent = m.get("parent")
    if parent is not None and not _is_id(parent):
        raise BadImport(f"{name}: its parent {_shown(parent)} is not a message id")
    role = m.get("role")
    if role not in ROLES:
        raise BadImport(f"{name} has the role {_shown(role)}: a Reame chat has only user and "
                        "assistant messages")
    if not isinstance(m.get("content"), str):
        raise BadImport(f"{name}: its content is {_kind(m.get('content'))}, not a text")
    stopped = m.get("stopped", False)
    if not isinstance(stopped, bool):
        raise BadImport(f"{name}: its stopped is {_kind(stopped)}, not true or false")
    assistant = role == "assistant"
    return ImportedMessage(
        key=key, parent=None if parent is None else _key(parent), role=role,
        content=m["content"], created_at=_time(m.get("created_at"), f"{name}'s created_at"),
        stopped=stopped and assistant,
        stats=_stats(m.get("stats"), name) if assistant else None)


def _is_id(value: object) -> bool:
    """A message id in a Reame document: a whole number (the store's) or a text."""
    return (isinstance(value, str) and value != "") or (
        type(value) is int and abs(value) < 1 << 63)


def _key(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _check_size(count: int) -> None:
    if count > MAX_MESSAGES_PER_CHAT:
        raise BadImport(f"a chat holds at most {MAX_MESSAGES_PER_CHAT:,} messages; this one "
                        f"has {count:,}")


def _parents_first(parents: dict[str, str | None], noun: str,
                   shown: dict[str, str] | None = None) -> list[str]:
    """The keys (each parent one of them), each after its parent; siblings stay in the file's
    order (which becomes their order as versions). BadImport for a cycle, naming its keys as
    shown (else as texts)."""
    order: list[str] = []
    placed: set[str] = set()
    waiting: dict[str, list[str]] = {}  # parent -> children met before it was placed
    for key, parent in parents.items():
        if parent is not None and parent not in placed:
            waiting.setdefault(parent, []).append(key)
            continue
        todo = [key]
        while todo:
            at = todo.pop()
            order.append(at)
            placed.add(at)
            todo.extend(reversed(waiting.pop(at, [])))
    if len(order) < len(parents):
        raise BadImport(_cycle(parents, placed, noun, shown or {}))
    return order


def _cycle(parents: dict[str, str | None], placed: set[str], noun: str,
           shown: dict[str, str]) -> str:
    """Words for a cycle of parents (what keeps the keys not placed from being placed)."""
    at = next(key for key in parents if key not in placed)
    path: dict[str, int] = {}  # key -> its place on the way up
    while at not in path:
        path[at] = len(path)
        at = parents[at]  # never None: a key whose parents lead to a root is placed
    loop = list(path)[path[at]:]
    if len(loop) == 1:
        return f"{noun} {shown.get(at, _shown(at))} names itself as its parent"
    names = ", ".join(shown.get(key, _shown(key)) for key in loop[:5])
    names += ", ..." if len(loop) > 5 else ""
    return (f"{noun}s {names} form a cycle: each follows another of them, so none of them "
            "comes first")


def _title(value: object) -> str:
    """A title the store takes: spaces tidied, a long one shortened (not refused: a title is
    not worth failing an import for), an empty one the default."""
    if value is None:
        return DEFAULT_TITLE
    if not isinstance(value, str):
        raise BadImport(f"the title is {_kind(value)}, not a text")
    title = " ".join(value.split())
    if len(title) > MAX_TITLE:
        title = title[:MAX_TITLE - 1].rstrip() + "…"
    return checked_title(title) or DEFAULT_TITLE


def _settings(value: object) -> dict[str, Any]:
    """The chat settings in a document, each checked against its range (a setting this
    server does not know is left out; null means the server's default)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadImport(f"the settings are {_kind(value)}, not a JSON object")
    given = {name: value[name] for name in FIELD if value.get(name) is not None}
    try:
        checked = ChatSettings().changed(**given)
    except ChatError as e:
        raise BadImport(f"settings: {e}") from None
    except OverflowError:  # a whole number too large for a float
        raise BadImport("settings: a number is far out of its range") from None
    return {name: getattr(checked, name) for name in given}


def _number(value: object) -> float | None:
    """value as a finite float, or None if it is no such number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _time(value: object, what: str) -> float | None:
    if value is None:
        return None
    number = _number(value)
    if number is None:
        raise BadImport(f"{what} is {_kind(value)}, not a time (seconds since 1970)")
    return number


def _stats(value: object, name: str) -> dict[str, Any] | None:
    """A reply's stats as the page can show them: the stats it knows, each of its type
    (stats it does not know, from another version, are left out)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadImport(f"{name}: its stats are {_kind(value)}, not a JSON object")
    stats: dict[str, Any] = {}
    for key, kind in _STAT_TYPES.items():
        if key not in value:
            continue
        stat = value[key]
        if kind is float and _number(stat) is not None:
            stats[key] = float(stat)
        elif kind is int and _number(stat) is not None and float(stat).is_integer() and (
                abs(stat) < 1 << 63):
            stats[key] = int(stat)
        elif kind in (str, bool) and type(stat) is kind:
            stats[key] = stat
        else:
            raise BadImport(f"{name}: its stat {key} is {_kind(stat)}, not "
                            f"{_TYPE_WORDS[kind]}")
    return stats or None


# ChatGPT's export


@dataclass
class _Seen:
    """What a ChatGPT node shows: a message with text."""

    role: str
    text: str
    created_at: float | None
    stopped: bool


def _chatgpt_chat(conversation: object) -> ImportedChat:
    """A ChatGPT conversation: its user and assistant messages with text, every branch. The
    nodes without one (the empty root, tool calls' results, hidden context) are left out: what
    followed them follows their nearest ancestor kept."""
    if not isinstance(conversation, dict):
        raise BadImport(f"a conversation is {_kind(conversation)}, not a JSON object")
    mapping = conversation.get("mapping")
    if not isinstance(mapping, dict):
        raise BadImport('a ChatGPT conversation has its messages in an object, "mapping"')
    parents: dict[str, str | None] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise BadImport(f"node {_shown(key)} is {_kind(node)}, not a JSON object")
        parent = node.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise BadImport(f"node {_shown(key)}: its parent is {_kind(parent)}, not a node id")
        parents[key] = parent
    for key, parent in parents.items():
        if parent is not None and parent not in parents:
            raise BadImport(f"node {_shown(key)} names parent {_shown(parent)}, which is not "
                            "in the conversation")
    messages: list[ImportedMessage] = []
    kept_above: dict[str, str | None] = {}  # node -> itself if kept, else its nearest kept ancestor
    system_prompt = ""
    for key in _parents_first(parents, "node"):
        parent = parents[key]
        above = kept_above[parent] if parent is not None else None
        kept_above[key] = above
        seen = _chatgpt_seen(mapping[key].get("message"))
        if seen is None:
            continue
        if seen.role == "system" and not system_prompt:
            system_prompt = seen.text.strip()
        elif seen.role in ROLES:
            messages.append(ImportedMessage(key, above, seen.role, seen.text, seen.created_at,
                                            seen.stopped))
            kept_above[key] = key
    _check_size(len(messages))
    title = conversation.get("title")
    return ImportedChat(
        title=_title(title if isinstance(title, str) else None),
        settings={"system_prompt": system_prompt},
        created_at=_number(conversation.get("create_time")), messages=messages,
        current=_chatgpt_current(conversation.get("current_node"), kept_above, messages))


def _chatgpt_current(node: object, kept_above: dict[str, str | None],
                     messages: list[ImportedMessage]) -> str | None:
    """The last message kept of the branch ChatGPT showed (without one: the file's last)."""
    if node is None:
        return messages[-1].key if messages else None
    if not isinstance(node, str) or node not in kept_above:
        raise BadImport(f'its "current_node" {_shown(node)} is not one of its nodes')
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
    stopped = (role == "assistant" and isinstance(finish, dict)
               and finish.get("type") == "interrupted")
    return _Seen(role, text, _number(message.get("create_time")), stopped)


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


# words for what a file holds


def _kind(value: object) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, list):
        return "a list"
    return "a JSON object" if isinstance(value, dict) else "not JSON"


def _shown(value: object) -> str:
    """A value of the file, short, as it is written there."""
    if isinstance(value, str):
        return '"' + (value if len(value) <= 40 else value[:39] + "…") + '"'
    if (type(value) is int and abs(value) < 10**40) or isinstance(value, float):
        return str(value)
    return _kind(value)
