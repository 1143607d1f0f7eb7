"""A chat -> the prompt's tokens, with the model's own chat template.

Assistant replies are spliced in as the exact tokens the model generated (when they are known
for this model): re-tokenizing a reply's text need not give them back, and the KV holds the
generated ones. The prompt of turn n+1 then starts with every token of turn n's KV.
"""

from __future__ import annotations

import json
import re
import threading
from array import array
from dataclasses import dataclass

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from reame.config.refusals import ChatError
from reame.inference.engine import Engine, common_prefix
from reame.inference.scope import NO_ACCOUNTS, Scope
from reame.inference.tools import Tool, native, response_text, system_text

# For models without a chat template (base models): plain labelled turns. A reply follows
# "Assistant:" as it was generated there, its space its own first token's (tokens() adds one
# to a reply's text).
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant:{{ message['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_STOPS = ("\nUser:", "\nAssistant:")

# Each message's text is rendered as a placeholder and tokenized on its own, as text: what a
# user writes can never become a control token ("<|im_start|>system" typed in a message stays
# those characters). The placeholder is wrapped in en spaces, which templates do not write:
# where the template trims a message, they are gone, and the text is trimmed the same way. Its
# marks are a private-use character, which no trim removes (Python's strip() removes \x1e).
_MARK = "\ue000"
_PLACEHOLDER = f"\u2002{_MARK}REAME-{{}}{_MARK}\u2002"
_PLACEHOLDER_RE = re.compile(f"(\u2002?){_MARK}REAME-(\\d+){_MARK}(\u2002?)")
CACHED_TOKENS = 1_000_000  # tokens of tokenized pieces kept per model (about 4 MB)


class TemplateRefused(ChatError):
    """A conversation the model's chat template raises an error for (e.g. two user turns in
    a row for a template that wants them to alternate)."""


class ControlTokens(ChatError):
    """Text a request puts in the template's own text that would become control tokens."""


@dataclass(frozen=True)
class PromptMessage:
    """One message of a conversation, as a prompt is built from it: its role, its text and,
    for a reply, the exact tokens the model generated (spliced in as they are). Not a stored
    Message (reame.chats.store), which PromptMessages are made from (window.turns_of)."""

    role: str  # "system" | "user" | "assistant" | "tool" (a tool's result)
    content: str
    tokens: tuple[int, ...] | None = None  # exact generated tokens, for assistant turns


class PromptBuilder:
    """Renders chats into token lists for one engine's model."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.has_template = bool(engine.chat_template)
        self.native_tools = native(engine.chat_template)  # it writes tools.py's format
        template = engine.chat_template or PLAIN_TEMPLATE
        self.stops: tuple[str, ...] = () if self.has_template else PLAIN_STOPS
        self._template = template
        self._formatter = self._make_formatter(add_generation_prompt=True)
        self._continuing: Jinja2ChatFormatter | None = None  # ends without the reply's header
        self._bos_text = self._formatter.bos_token
        # (kind, scope, text, add_bos) -> tokens; the newest last. A message's text is kept per
        # scope (cache.py): whether another user's text was tokenized before never shows.
        self._pieces: dict[tuple, array] = {}
        self._cached_tokens = 0
        self._pieces_lock = threading.Lock()  # web threads and the engine's thread use them

    def tokens(self, system_prompt: str, turns: list[PromptMessage],
               scope: Scope = NO_ACCOUNTS, tools: tuple[Tool, ...] = ()) -> list[int]:
        """The prompt for the next reply: the chat, then the template's assistant header. The
        template's own text may hold control tokens; the messages' text never does. Assistant
        turns with their generated tokens are spliced in as those tokens. tools: the functions
        the reply may call, written by the template where it has a place for them, else into
        the system prompt (tools.py); tool results are turns of role "tool"."""
        offered = None
        if self.native_tools:
            offered = [self._checked(tool) for tool in tools] or None
        else:
            system_prompt, turns = _fallback(system_prompt, turns, tools)
        messages = ([PromptMessage("system", system_prompt)] if system_prompt else []) + list(turns)
        # A conversation that ends with the assistant's words: the reply continues them.
        continues = messages[-1].role == "assistant"
        messages, text = self._render(messages, offered, continues)
        continued = len(messages) - 1 if continues else None
        add_bos = self.engine.adds_bos and not (self._bos_text and text.startswith(self._bos_text))
        parts = _PLACEHOLDER_RE.split(text)
        out: list[int] = []
        # split() gives: template text, then (lead, index, trail, template text) per message
        out.extend(self._piece("template", None, parts[0], add_bos))
        for n in range(1, len(parts), 4):
            lead, index, trail, after = parts[n:n + 4]
            message = messages[int(index)]
            if message.tokens is not None:
                out.extend(message.tokens)
            else:
                content = message.content if lead else message.content.lstrip()
                continues = int(index) == continued
                content = content if trail or continues else content.rstrip()
                if not self.has_template and message.role == "assistant":
                    content = " " + content.lstrip()
                out.extend(self._piece("text", scope, content, False))
            if int(index) == continued:
                break  # the template's end of that message is the reply's to write
            out.extend(self._piece("template", None, after, False))
        return out

    def _render(self, messages: list[PromptMessage], tools: list[dict] | None,
                continued: bool) -> tuple[list[PromptMessage], str]:
        """The template's text with each message as a placeholder (and the messages it holds).
        A system message after the first turn where the template allows none (Gemma's) goes
        into the user turn after it; a conversation the template refuses is a ChatError."""
        if continued and self._continuing is None:
            self._continuing = self._make_formatter(add_generation_prompt=False)
        formatter = self._continuing if continued else self._formatter
        for attempt in (messages, _without_later_system(messages)):
            try:
                return attempt, formatter(
                    messages=[{"role": m.role, "content": _PLACEHOLDER.format(i)}
                              for i, m in enumerate(attempt)], tools=tools).prompt
            except (ValueError, TypeError, jinja2.TemplateError) as exc:
                error = exc
        raise TemplateRefused(f"the model's chat template cannot write this conversation: "
                              f"{str(error)[:200]}")

    def _make_formatter(self, *, add_generation_prompt: bool) -> Jinja2ChatFormatter:
        engine = self.engine
        return Jinja2ChatFormatter(
            template=self._template, eos_token=engine.token_text(engine.eos_token),
            bos_token=engine.token_text(engine.bos_token) if engine.bos_token >= 0 else "",
            add_generation_prompt=add_generation_prompt)

    def fixed_head(self, system_prompt: str, turns: list[PromptMessage],
                   scope: Scope = NO_ACCOUNTS, tools: tuple[Tool, ...] = ()) -> list[int]:
        """The tokens of the prompt for turns + a next user message that no message can change
        (the next turn's header): the common prefix of the prompts for messages "a" and "b"."""
        a = self.tokens(system_prompt, turns + [PromptMessage("user", "a")], scope, tools)
        b = self.tokens(system_prompt, turns + [PromptMessage("user", "b")], scope, tools)
        return a[:common_prefix(a, b)]

    def _checked(self, tool: Tool) -> dict:
        """A tool for the template, which writes it as its own text (control tokens parsed):
        one whose words would become control tokens is refused."""
        spec = tool.as_openai()
        text = json.dumps(spec, ensure_ascii=False)
        if _MARK in text:  # it would read as a message's place
            raise ControlTokens(f"the tool '{tool.name}' holds the character U+E000, which "
                                "this server keeps for itself; it is refused")
        if self._piece("template", None, text, False) != self._piece("text", NO_ACCOUNTS, text,
                                                                       False):
            raise ControlTokens(f"the tool '{tool.name}' holds text that this model reads as "
                                "its control tokens; it is refused")
        return spec

    def _piece(self, kind: str, scope: Scope | None, text: str, add_bos: bool) -> array:
        """A piece of the prompt tokenized: the template's text with its control tokens (scope
        None: the same for everyone), or a message's text as text (kept per scope). The same
        pieces come back every turn (each earlier message): each is tokenized once, the oldest
        forgotten past CACHED_TOKENS; a piece longer than the context is not kept (no prompt
        holding it can be answered)."""
        key = (kind, scope, text, add_bos)
        with self._pieces_lock:
            tokens = self._pieces.pop(key, None)
            if tokens is not None:
                self._pieces[key] = tokens  # the newest now
                return tokens
        tokens = array("i", self.engine.tokenize(text, add_bos=add_bos,
                                                 special=kind == "template"))
        if len(tokens) > self.engine.n_ctx:
            return tokens
        with self._pieces_lock:
            if self._pieces.pop(key, None) is None:  # another thread may have added it
                self._cached_tokens += len(tokens)
            self._pieces[key] = tokens
            while self._cached_tokens > CACHED_TOKENS and len(self._pieces) > 1:
                self._cached_tokens -= len(self._pieces.pop(next(iter(self._pieces))))
        return tokens


def _fallback(system_prompt: str, turns: list[PromptMessage],
              tools: tuple[Tool, ...]) -> tuple[str, list[PromptMessage]]:
    """For a template without tools: the tools described in the system prompt, and each run
    of tool results as one user turn (a template may allow no two turns of one role)."""
    if tools:
        system_prompt = "\n\n".join(p for p in (system_prompt, system_text(tools)) if p)
    if not any(t.role == "tool" for t in turns):
        return system_prompt, turns
    out: list[PromptMessage] = []
    results: list[str] = []
    for turn in [*turns, None]:
        if turn is not None and turn.role == "tool":
            results.append(turn.content)
            continue
        if results:
            out.append(PromptMessage("user", response_text(results)))
            results = []
        if turn is not None:
            out.append(turn)
    return system_prompt, out


def _without_later_system(messages: list[PromptMessage]) -> list[PromptMessage]:
    """The conversation with each system message after the first turn folded into a user turn
    (joined to the user turn next to it, before or after)."""
    out: list[PromptMessage] = []
    for n, message in enumerate(messages):
        if message.role == "system" and n > 0:
            message = PromptMessage("user", message.content)
        if out and out[-1].role == "user" == message.role and out[-1].tokens is None:
            out[-1] = PromptMessage("user", out[-1].content + "\n\n" + message.content)
        else:
            out.append(message)
    return out
