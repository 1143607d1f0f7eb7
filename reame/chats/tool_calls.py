"""Tool calls in a stored chat (X-Reame-Chat with tools): what a turn offers (ToolOffer), a
reply's calls as they are kept (kept_calls), and the results a client sends back checked
against the calls they answer (result_messages).

A reply that calls tools is kept as its words (the text before the calls) and its calls, each
with an id; its exact tokens are kept too, so the next prompt holds what the model wrote. A
result is a message of role "tool" naming the call it answers. The prompt is rebuilt from them
as a stateless conversation with the same calls is (window.turns_of, tools.py, prompt.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from reame.chats.messages import Role, call_id
from reame.config.refusals import ChatError
from reame.inference.tools import CALL_OPEN, Tool, split_reply


@dataclass(frozen=True)
class ToolOffer:
    """The tools a stored chat's turn offers: the functions (in the prompt), the grammar a
    call follows and where it starts (None: from the first token), and the prefix of the ids
    its calls get (call_id: the answer names them the same way before they are kept)."""

    tools: tuple[Tool, ...]
    grammar: str | None
    grammar_trigger: str | None
    id_prefix: str


class ResultRefused(ChatError):
    """Tool results that do not answer the chat's last reply's calls."""

    param = "messages"


def kept_calls(text: str, id_prefix: str) -> tuple[str, list[dict]]:
    """A reply's words and its calls as kept ({"id", "name", "arguments"}). A call begun and
    never finished (max_tokens cut it) is no words: its markup is left out."""
    content, calls = split_reply(text)
    return words_so_far(content), [{"id": call_id(id_prefix, n), "name": c.name, "arguments": c.arguments}
                     for n, c in enumerate(calls)]


def words_so_far(text: str) -> str:
    """A reply's text so far without what may be a call being written (kept while it
    streams: a reader of the chat meanwhile sees no call's markup)."""
    at = text.find(CALL_OPEN)
    return text if at < 0 else text[:at].rstrip()


def result_messages(last_calls: list[dict] | None,
                    results: list[tuple[str, str]]) -> list[dict]:
    """The messages that keep results ((call id, content) each) of the calls of the chat's
    last reply (last_calls; None: the chat's last message is no reply that called tools).
    Each call is answered once, every call of the reply is; ResultRefused otherwise."""
    if not last_calls:
        raise ResultRefused("a tool's result answers a call of the chat's last reply, and the "
                            "chat's last message is not a reply that called tools")
    names = {c["id"]: c["name"] for c in last_calls}
    given = [call for call, _ in results]
    for call in given:
        if call not in names:
            raise ResultRefused(f"the tool result names the call '{call}', which is not one "
                                f"of the chat's last reply ({', '.join(names)})")
        if given.count(call) > 1:
            raise ResultRefused(f"the call '{call}' is answered twice")
    missing = [call for call in names if call not in given]
    if missing:
        raise ResultRefused(f"the call '{missing[0]}' of the chat's last reply has no result: "
                            "send a tool message for each call")
    return [dict(role=Role.TOOL, content=content, tool_call_id=call)
            for call, content in results]
