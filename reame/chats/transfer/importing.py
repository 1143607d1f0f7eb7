"""Import: parse_import reads a Reame document (one chat or several) or ChatGPT's export;
whatever the file's JSON shape, it returns chats or raises BadImport, never another
exception."""

from __future__ import annotations

from reame.chats.messages import Role
from reame.chats.transfer.chatgpt import chatgpt_chat
from reame.chats.transfer.checks import (
    FORMAT_CHAT,
    FORMAT_CHATS,
    ROLES,
    VERSION,
    BadImport,
    ImportedChat,
    ImportedMessage,
    check_size,
    is_id,
    kind_of,
    parents_first,
    read_chats,
    read_calls,
    read_key,
    read_settings,
    read_stats,
    read_time,
    read_title,
    shown_value,
)


def parse_import(data: object) -> list[ImportedChat]:
    """The chats of an import file (parsed JSON): a Reame document of one chat or of several,
    or ChatGPT's conversations.json (a list of conversations, or one of them). BadImport,
    saying what is wrong, for anything else."""
    if isinstance(data, list):
        return read_chats(data, chatgpt_chat, "conversation")
    if not isinstance(data, dict):
        raise BadImport("not a Reame or ChatGPT export: the file holds "
                        f"{kind_of(data)}, not a JSON object or list")
    form = data.get("format")
    if form == FORMAT_CHAT:
        check_version(data)
        return [_reame_chat(data)]
    if form == FORMAT_CHATS:
        check_version(data)
        chats = data.get("chats")
        if not isinstance(chats, list):
            raise BadImport('a Reame export of several chats has them in a list, "chats"')
        return read_chats(chats, _reame_chat, "chat")
    if form is None and "mapping" in data:  # one conversation taken out of conversations.json
        return read_chats([data], chatgpt_chat, "conversation")
    if form is None:
        raise BadImport('not a Reame or ChatGPT export: it has no "format" (a Reame export '
                        'says "reame-chat" or "reame-chats") and no ChatGPT "mapping"')
    raise BadImport(f"not a Reame or ChatGPT export: its format is {shown_value(form)}, not "
                    f'"{FORMAT_CHAT}" or "{FORMAT_CHATS}"')


def check_version(doc: dict) -> None:
    version = doc.get("version")
    if version is None:
        raise BadImport("the file does not say which version of the Reame export format it "
                        f'is ("version"; this server reads version {VERSION})')
    if type(version) is not int or version != VERSION:
        raise BadImport(f"this file is version {shown_value(version)} of the Reame export format; "
                        f"this server reads version {VERSION}")


def _reame_chat(doc: object) -> ImportedChat:
    if not isinstance(doc, dict):
        raise BadImport(f"a chat is {kind_of(doc)}, not a JSON object")
    if doc.get("format", FORMAT_CHAT) != FORMAT_CHAT:
        raise BadImport(f'a chat\'s format is "{FORMAT_CHAT}", not {shown_value(doc.get("format"))}')
    listed = doc.get("messages")
    if not isinstance(listed, list):
        raise BadImport('a chat has its messages in a list, "messages"')
    check_size(len(listed))
    messages = [_reame_message(n, m) for n, m in enumerate(listed, 1)]
    parents: dict[str, str | None] = {}
    shown: dict[str, str] = {}  # key -> the id as the file writes it
    for m, raw in zip(messages, listed):
        shown[m.key] = shown_value(raw["id"])
        if m.key in parents:
            raise BadImport(f"two messages have the id {shown[m.key]}")
        parents[m.key] = m.parent
    for m, raw in zip(messages, listed):
        if m.parent is not None and m.parent not in parents:
            raise BadImport(f"message {shown[m.key]} names parent {shown_value(raw['parent'])}, "
                            "which is not in the chat")
    by_key = {m.key: m for m in messages}
    for m in messages:  # a tool's result answers a call of the reply it follows
        above, seen = by_key.get(m.parent), set()
        while above is not None and above.role == Role.TOOL and above.key not in seen:
            seen.add(above.key)  # past the results before it (a cycle is refused below)
            above = by_key.get(above.parent)
        if m.role == Role.TOOL and not any(c["id"] == m.tool_call_id
                                           for c in (above.tool_calls if above else None) or ()):
            raise BadImport(f"message {shown[m.key]} answers the call "
                            f"{shown_value(m.tool_call_id)}, which the reply before it did "
                            "not make")
    order = {key: n for n, key in enumerate(parents_first(parents, "message", shown))}
    messages.sort(key=lambda m: order[m.key])
    current = doc.get("current")
    if current is not None and not (is_id(current) and read_key(current) in parents):
        raise BadImport(f'"current" names message {shown_value(current)}, which is not in the chat')
    flags = {}
    for flag in ("pinned", "archived"):  # absent from files of before they were exported
        flags[flag] = doc.get(flag, False)
        if not isinstance(flags[flag], bool):
            raise BadImport(f"the chat's {flag} is {kind_of(flags[flag])}, not true or false")
    return ImportedChat(
        title=read_title(doc.get("title")), settings=read_settings(doc.get("settings")),
        created_at=read_time(doc.get("created_at"), "the chat's created_at"),
        messages=messages, current=None if current is None else read_key(current), **flags)


def _reame_message(n: int, m: object) -> ImportedMessage:
    if not isinstance(m, dict):
        raise BadImport(f"message {n} of the list is {kind_of(m)}, not a JSON object")
    if not is_id(m.get("id")):
        raise BadImport(f"message {n} of the list has no id (a whole number or a text)")
    key = read_key(m["id"])
    name = f"message {shown_value(m['id'])}"
    parent = m.get("parent")
    if parent is not None and not is_id(parent):
        raise BadImport(f"{name}: its parent {shown_value(parent)} is not a message id")
    role = m.get("role")
    if role not in ROLES:
        raise BadImport(f"{name} has the role {shown_value(role)}: a Reame chat has only user, "
                        "assistant and tool messages")
    if not isinstance(m.get("content"), str):
        raise BadImport(f"{name}: its content is {kind_of(m.get('content'))}, not a text")
    stopped = m.get("stopped", False)
    if not isinstance(stopped, bool):
        raise BadImport(f"{name}: its stopped is {kind_of(stopped)}, not true or false")
    assistant = role == Role.ASSISTANT
    if m.get("tool_calls") is not None and not assistant:
        raise BadImport(f"{name}: only a reply has tool_calls")
    answers = m.get("tool_call_id")
    if (role == Role.TOOL) != (answers is not None) or (
            answers is not None and (not isinstance(answers, str) or not answers)):
        raise BadImport(f"{name}: a tool message, and only one, names the call it answers "
                        f"(tool_call_id, a text); it has {shown_value(answers)}")
    return ImportedMessage(
        key=key, parent=None if parent is None else read_key(parent), role=role,
        content=m["content"], created_at=read_time(m.get("created_at"), f"{name}'s created_at"),
        stopped=stopped and assistant,
        stats=read_stats(m.get("stats"), name) if assistant else None,
        tool_calls=read_calls(m.get("tool_calls"), name), tool_call_id=answers)
