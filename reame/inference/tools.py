"""Tool calling: how the tools a request offers reach the prompt, how a reply calls them, and
the grammar that holds a call to a tool's parameters.

One format for every model, the one Qwen 2.5/3, Hermes and SmolLM3 were trained on (their
chat templates write it): a call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and a tool's result comes back to the model as <tool_response>...</tool_response> in a user
turn. A template with a tools section in this format (native) renders the tools itself; for
any other model the same instructions are written into the system prompt (fallback). Either
way a call the model writes follows a grammar made from the tools' JSON schemas: from its first
token when a call is required, from "<tool_call>" on when the model may choose (a lazy grammar).

A reply is kept as the text the model wrote, and a call sent back by a client is rendered to
the same text (reply_text): the next prompt holds the reply's own tokens, so its KV is reused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llama_cpp.llama_grammar import SchemaConverter

from reame.inference.grammar_bounds import check_schema_cost

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

_CALL_HEAD = CALL_OPEN + '\n{"name": '
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r'\n\{"name": ("(?:[^"\\]|\\.)*"), "arguments": '
                      r'([\s\S]*?)\}\n' + re.escape(CALL_CLOSE))


@dataclass(frozen=True)
class Tool:
    """A function the client offers: its name, its parameters' JSON schema, and the whole
    definition as written (what the model reads)."""

    name: str
    parameters: str = '{"type": "object"}'  # JSON text of the schema
    spec: str = ""  # JSON text of the tool as the client wrote it ({"type": "function", ...})

    def as_openai(self) -> dict:
        return json.loads(self.spec) if self.spec else {
            "type": "function", "function": {"name": self.name,
                                             "parameters": json.loads(self.parameters)}}


@dataclass(frozen=True)
class ToolCall:
    """A call in a reply: the function's name and its arguments as the JSON text written."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers and whether the reply may, must or must not call them:
    choice is "auto", "none", "required" or a tool's name."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    @property
    def named(self) -> Tool | None:
        return next((t for t in self.tools if t.name == self.choice), None)


def call_text(call: ToolCall) -> str:
    return f'{_CALL_HEAD}{json.dumps(call.name)}, "arguments": {call.arguments}}}\n{CALL_CLOSE}'


def reply_text(content: str, calls: tuple[ToolCall, ...] | list[ToolCall]) -> str:
    """A reply as the model writes it: its text, then each call on lines of its own."""
    return "\n".join(([content] if content else []) + [call_text(c) for c in calls])


def split_reply(text: str) -> tuple[str, list[ToolCall]]:
    """A reply's text before its first call, and its calls (each with arguments that parse
    as a JSON object). Text after the calls (a call cut short, words) is kept as text."""
    content, calls, rest = split_calls(text)
    return (content + ("\n" + rest if rest else "")).strip("\n"), calls


def split_calls(text: str) -> tuple[str, list[ToolCall], str]:
    """A reply's text before its first call, its calls one after the other, and the text
    after them (all of it when there are no calls)."""
    calls: list[ToolCall] = []
    content_end = at = 0
    for match in _CALL_RE.finditer(text):
        if calls and text[at:match.start()].strip():
            break  # calls follow each other
        try:
            name, arguments = json.loads(match.group(1)), match.group(2)
            if not isinstance(json.loads(arguments), dict):
                break
        except ValueError:
            break
        if not calls:
            content_end = match.start()
        calls.append(ToolCall(name, arguments))
        at = match.end()
    if not calls:
        return text, [], ""
    return text[:content_end].rstrip(), calls, text[at:].strip()


def repeated_call(text: str) -> int | None:
    """Where a reply's text ends when its last call repeats an earlier one, the same function
    with the same arguments (a small model may write one call over and over): just after
    the calls before it. None otherwise."""
    if not text.endswith(CALL_CLOSE):
        return None
    matches = list(_CALL_RE.finditer(text))
    try:
        seen = [(json.loads(m.group(1)), json.loads(m.group(2))) for m in matches]
    except ValueError:
        return None
    if len(seen) > 1 and seen[-1] in seen[:-1]:
        return matches[-2].end()
    return None


def canonical(text: str) -> str | None:
    """The text a client sends back for a reply that called tools (reply_text of its parts),
    when it is not the text itself; None otherwise."""
    content, calls = split_reply(text)
    if not calls:
        return None
    again = reply_text(content, calls)
    return again if again != text else None


def pending_text(text: str) -> int:
    """Where the text that may still become a call starts: at a call begun, or at a tail that
    "<tool_call>" starts with; len(text) when none. A stream holds the rest back."""
    at = text.find(CALL_OPEN)
    if at >= 0:
        return at
    for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-n:]):
            return len(text) - n
    return len(text)


def system_text(tools: tuple[Tool, ...]) -> str:
    """The tools and how to call them, for a system prompt (the fallback)."""
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            f"within {CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n' + CALL_CLOSE)


def response_text(results: list[str]) -> str:
    """Tool results, in the order of the calls, as one user turn's text (the fallback)."""
    return "\n".join(f"{RESPONSE_OPEN}\n{r}\n{RESPONSE_CLOSE}" for r in results)


def native(template: str | None) -> bool:
    """Whether a chat template writes tools and calls in this module's format itself."""
    return bool(template) and "tools" in template and CALL_OPEN in template


class SchemaError(ValueError):
    """A tool's parameters that no grammar can follow; `index` is the tool's."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index


def grammar(use: ToolUse) -> tuple[str, bool]:
    """The GBNF a reply follows and whether it is lazy (starts at "<tool_call>"). With choice
    "none", any text without "<tool_call>": the model, kept from a call, answers in words
    (a small one would otherwise begin the call again). SchemaError names a tool whose
    parameters cannot be expressed."""
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                raw_pattern=False)
    if use.choice == "none":
        return _without(CALL_OPEN), False
    offered = (use.named,) if use.named is not None else use.tools
    alternatives = []
    for tool in offered:
        index = use.tools.index(tool)
        try:
            parameters = json.loads(tool.parameters)
            check_schema_cost(parameters)  # before the converter writes it out
            schema = converter.resolve_refs(parameters, f"tool{index}")
            rule = converter.visit(schema, f"tool{index}-arguments")
        except Exception as exc:  # the converter's own words
            raise SchemaError(index, str(exc)[:200]) from None
        name = converter._format_literal(json.dumps(tool.name) + ', "arguments": ')
        alternatives.append(f"{name} {rule}")
    call = (converter._format_literal(_CALL_HEAD) + " ( " + " | ".join(alternatives) + " ) "
            + converter._format_literal("}\n" + CALL_CLOSE))
    converter._add_rule("tool-call", call)
    # A named function is called once; otherwise as many calls as the model writes.
    many = ' ( "\\n" tool-call )*' if use.parallel and use.named is None else ""
    converter._add_rule("root", "tool-call" + many)
    return converter.format_grammar(), use.choice == "auto"


def _without(literal: str) -> str:
    """GBNF for any text that does not hold literal (whose first character occurs in it only
    there): a machine of how much of it the text ends with, as right-recursive rules (llama.cpp
    keeps its stack flat through them); it may end anywhere."""
    first, rest = literal[0], literal[1:]

    def char(c: str) -> str:
        return '"' + c.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def others(*chars: str) -> str:
        return "[^" + "".join("\\" + c if c in "]^-\\" else c for c in chars) + "]"

    rules = ["root ::= free", f"free ::= \"\" | {others(first)} free | {char(first)} seen0"]
    for k, c in enumerate(rest):
        step = f" | {char(c)} seen{k + 1}" if k + 1 < len(rest) else ""
        rules.append(f"seen{k} ::= \"\" | {char(first)} seen0 | {others(first, c)} free{step}")
    return "\n".join(rules)
