"""What an import becomes (ImportedChat, ImportedMessage), its limits, and the checks both
formats share: each value read from the file is checked, and BadImport says what is wrong
in words for the person who uploaded it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError, create_model

from reame.chats.messages import Role
from reame.chats.titles import DEFAULT_TITLE, MAX_TITLE, checked_title
from reame.config.chat_settings import FIELD, ChatSettings
from reame.config.reame_conf import setting
from reame.config.refusals import ChatError
from reame.config.setting import STRICT, WHOLE_NUMBER, first_problem
from reame.inference.turn import TurnStats

FORMAT_CHAT = "reame-chat"
FORMAT_CHATS = "reame-chats"
VERSION = 1
# chats in one import: as many as one user may keep unless reame.conf says otherwise
MAX_CHATS = setting("storage", "max_chats_per_user").default
MAX_MESSAGES_PER_CHAT = 10000  # messages of one imported chat, every version counted
ROLES = Role.ALL  # in Reame's own export
CHATGPT_ROLES = (Role.USER, Role.ASSISTANT)  # what is kept of ChatGPT's (its tools' are not)
HIDDEN = "is_visually_hidden_from_conversation"  # ChatGPT's flag on messages not shown

TYPE_WORDS = {int: "a whole number", float: "a number", str: "a text", bool: "true or false"}
# The type of each stat shown under a reply (render.stats_text formats them as such), and
# the mark of a reply whose server stopped while writing it (chat_keeper.UNFINISHED).
STAT_TYPES: dict[str, type] = {f.name: type(f.default) for f in fields(TurnStats)
                                if type(f.default) in TYPE_WORDS} | {"unfinished": bool}
# The stats as pydantic checks them, strict as JSON means its types (a whole number may be
# written 7.0); stats this server does not know are left out.
STATS = create_model("Stats", __config__=ConfigDict(STRICT, extra="ignore"), **{
    key: (WHOLE_NUMBER if kind is int else kind, None) for key, kind in STAT_TYPES.items()})
_NUMBER = TypeAdapter(float, config=STRICT)  # finite; an int too large for a float is none


class BadImport(ChatError):
    """A file that cannot be imported; the message says what is wrong in it."""


@dataclass
class ImportedMessage:
    key: str  # its id in the file (unique in its chat); parents and `current` name it
    parent: str | None  # the key of the message it follows; None: a first message
    role: str  # Role.USER | Role.ASSISTANT | Role.TOOL
    content: str
    created_at: float | None = None
    stopped: bool = False  # a reply the user stopped
    stats: dict[str, Any] | None = None  # a reply's TurnStats, as stored
    tool_calls: list[dict] | None = None  # a reply's calls: {"id", "name", "arguments"} each
    tool_call_id: str | None = None  # a tool's result: the call it answers


@dataclass
class ImportedChat:
    title: str
    settings: dict[str, Any]  # only chat settings (chat_settings.FIELD), each already checked
    created_at: float | None
    messages: list[ImportedMessage]  # every version; each after its parent
    current: str | None  # the key of the last message of the branch shown
    # From another product (ChatGPT): imported once (a Reame export imported again is a copy)
    from_elsewhere: bool = False
    pinned: bool = False  # at the top of the list
    archived: bool = False  # out of the list, still found by search

    def settings_over(self, defaults: ChatSettings) -> ChatSettings:
        """The chat's settings: the file's over the server's defaults (a file may hold some of
        them, a ChatGPT export only the system prompt). ChatError for a value out of range."""
        return defaults.changed(**self.settings)


def read_chats(docs: list, parse: Callable[[object], ImportedChat], noun: str) -> list[ImportedChat]:
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
            named = f" ({shown_value(title)})" if isinstance(title, str) and title.strip() else ""
            raise BadImport(f"{noun} {n}{named}: {e}") from None
    return chats


def is_id(value: object) -> bool:
    """A message id in a Reame document: a whole number (the store's) or a text."""
    return (isinstance(value, str) and value != "") or (
        type(value) is int and abs(value) < 1 << 63)


def read_key(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def check_size(count: int) -> None:
    if count > MAX_MESSAGES_PER_CHAT:
        raise BadImport(f"a chat holds at most {MAX_MESSAGES_PER_CHAT:,} messages; this one "
                        f"has {count:,}")


def parents_first(parents: dict[str, str | None], noun: str,
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
        raise BadImport(find_cycle(parents, placed, noun, shown or {}))
    return order


def find_cycle(parents: dict[str, str | None], placed: set[str], noun: str,
           shown: dict[str, str]) -> str:
    """Words for a cycle of parents (what keeps the keys not placed from being placed)."""
    at = next(key for key in parents if key not in placed)
    path: dict[str, int] = {}  # key -> its place on the way up
    while at not in path:
        path[at] = len(path)
        at = parents[at]  # never None: a key whose parents lead to a root is placed
    loop = list(path)[path[at]:]
    if len(loop) == 1:
        return f"{noun} {shown.get(at, shown_value(at))} names itself as its parent"
    names = ", ".join(shown.get(key, shown_value(key)) for key in loop[:5])
    names += ", ..." if len(loop) > 5 else ""
    return (f"{noun}s {names} form a cycle: each follows another of them, so none of them "
            "comes first")


def read_title(value: object) -> str:
    """A title the store takes: spaces tidied, a long one shortened (not refused: a title is
    not worth failing an import for), an empty one the default."""
    if value is None:
        return DEFAULT_TITLE
    if not isinstance(value, str):
        raise BadImport(f"the title is {kind_of(value)}, not a text")
    title = " ".join(value.split())
    if len(title) > MAX_TITLE:
        title = title[:MAX_TITLE - 1].rstrip() + "…"
    return checked_title(title) or DEFAULT_TITLE


def read_settings(value: object) -> dict[str, Any]:
    """The chat settings in a document, each checked against its range (a setting this
    server does not know is left out; null means the server's default)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadImport(f"the settings are {kind_of(value)}, not a JSON object")
    given = {name: value[name] for name in FIELD if value.get(name) is not None}
    try:
        checked = ChatSettings().changed(**given)
    except ChatError as e:
        raise BadImport(f"settings: {e}") from None
    except OverflowError:  # a whole number too large for a float
        raise BadImport("settings: a number is far out of its range") from None
    return {name: getattr(checked, name) for name in given}


def read_number(value: object) -> float | None:
    """value as a finite float, or None if it is no such number."""
    try:
        return _NUMBER.validate_python(value)
    except ValidationError:
        return None


def read_time(value: object, what: str) -> float | None:
    if value is None:
        return None
    number = read_number(value)
    if number is None:
        raise BadImport(f"{what} is {kind_of(value)}, not a time (seconds since 1970)")
    return number


def read_stats(value: object, name: str) -> dict[str, Any] | None:
    """A reply's stats as the page can show them: the stats it knows, each of its type
    (stats it does not know, from another version, are left out)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadImport(f"{name}: its stats are {kind_of(value)}, not a JSON object")
    try:
        stats = STATS.model_validate(value)
    except ValidationError as exc:
        key, _ = first_problem(exc)
        raise BadImport(f"{name}: its stat {key} is {kind_of(value[key])}, not "
                        f"{TYPE_WORDS[STAT_TYPES[key]]}") from None
    return stats.model_dump(exclude_unset=True) or None


def read_calls(value: object, name: str) -> list[dict] | None:
    """A reply's tool calls as the store keeps them: a list of {"id", "name", "arguments"},
    each a text, the arguments the JSON text of an object, no id twice."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadImport(f"{name}: its tool_calls are {kind_of(value)}, not a list")
    calls, ids = [], set()
    for n, call in enumerate(value, 1):
        where = f"{name}: tool call {n}"
        if not isinstance(call, dict):
            raise BadImport(f"{where} is {kind_of(call)}, not a JSON object")
        for key in ("id", "name", "arguments"):
            if not isinstance(call.get(key), str) or not call[key]:
                raise BadImport(f"{where} has no {key} (a text): it is "
                                f"{shown_value(call.get(key))}")
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise BadImport(f"{where}: its arguments are not the JSON text of an object")
        if call["id"] in ids:
            raise BadImport(f"{where}: the id {shown_value(call['id'])} is used twice")
        ids.add(call["id"])
        calls.append({key: call[key] for key in ("id", "name", "arguments")})
    return calls or None


# words for what a file holds


def kind_of(value: object) -> str:
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


def shown_value(value: object) -> str:
    """A value of the file, short, as it is written there."""
    if isinstance(value, str):
        return '"' + (value if len(value) <= 40 else value[:39] + "…") + '"'
    if (type(value) is int and abs(value) < 10**40) or isinstance(value, float):
        return str(value)
    return kind_of(value)
