"""The body of POST /v1/messages (Anthropic's Messages API) read into what a stateless turn
needs: the system prompt, the turns (a tool_use block is the call as the model writes it, a
tool_result block a "tool" turn), the tools and the grammar a call follows.

Every field of Anthropic's is honoured, accepted with no effect (documented in docs/api.md:
cache_control, metadata, thinking, ...) or refused by name; a field that is not Anthropic's is
refused too. The errors are ApiErrors; messages.py says them in Anthropic's shape."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from reame.chats.conversation import STATELESS_TEMPERATURE
from reame.inference.prompt import PromptMessage
from reame.inference.tools import SchemaError, Tool, ToolCall, ToolUse, reply_text
from reame.inference.tools import grammar as tool_grammar
from reame.web.v1.chat_request import response_grammar
from reame.web.v1.errors import ApiError, body_refusal, refuse_unsupported
from reame.web.v1.request_models import (
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TOOLS,
    FunctionName,
    NonEmpty,
    Positive,
    StopString,
    StrictBody,
    TopP,
)

Temperature01 = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # Anthropic's range


class TextBlock(StrictBody):
    type: Literal["text"]
    text: str
    cache_control: Any = None  # accepted: every prompt's KV is kept here anyway
    citations: Any = None  # accepted when null


class ToolUseBlock(StrictBody):
    type: Literal["tool_use"]
    id: NonEmpty
    name: FunctionName
    input: dict[str, Any]
    cache_control: Any = None


class ToolResultBlock(StrictBody):
    type: Literal["tool_result"]
    tool_use_id: NonEmpty
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: Any = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class AnthropicMessage(StrictBody):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(StrictBody):
    name: FunctionName
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None  # server tools (web search, ...) are refused
    cache_control: Any = None


class ToolChoice(StrictBody):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: bool | None = None


class JsonFormat(StrictBody):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictBody):
    format: JsonFormat | None = None
    effort: str | None = None


class MessagesRequest(StrictBody):
    model: NonEmpty
    messages: Annotated[list[AnthropicMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: Positive
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    temperature: Temperature01 | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=1, le=1000)] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    # Accepted, no effect: a user id for the provider's records (Reame keeps none), extended
    # thinking (these models have no separate thinking), the provider's tiers and context
    # editing.
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None
    context_management: Any = None
    cache_control: Any = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    # Honoured: output_config.format (a JSON schema the reply follows); effort has no effect.
    output_config: OutputConfig | None = None
    # Refused unless null (UNSUPPORTED).
    container: Any = None
    diagnostics: Any = None
    mcp_servers: Any = None


UNSUPPORTED = {
    "container": ((None,), "code execution containers are not run here"),
    "diagnostics": ((None,), "no prompt-cache diagnostics: the KV is found by the tokens"),
    "mcp_servers": ((None, []), "this server connects to no MCP servers"),
}


class CountRequest(StrictBody):
    """POST /v1/messages/count_tokens: the request without what shapes only the reply."""
    model: NonEmpty
    messages: Annotated[list[AnthropicMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


EXPECTED = {
    "": "a JSON object",
    "model": "a model name (any: the loaded model answers)",
    "messages": f"a non-empty array of at most {MAX_MESSAGES:,} messages",
    "messages[]": "an object with a role (user or assistant) and content",
    "messages[].role": "user or assistant",
    "messages[].content": "a string or an array of text, tool_use and tool_result blocks",
    "max_tokens": "a positive integer (required)",
    "system": "a string or an array of text blocks",
    "stop_sequences": (f"an array of up to {MAX_STOPS} non-empty strings of at most "
                       f"{MAX_STOP_CHARS} characters"),
    "stream": "true or false",
    "temperature": "a number from 0 to 1",
    "top_p": "a number from 0 to 1",
    "top_k": "an integer from 1 to 1000",
    "tools": f"an array of at most {MAX_TOOLS} tools, {{name, description, input_schema}}",
    "tools[]": "a tool, {name, description, input_schema} (client tools only)",
    "tools[].name": "a tool name (letters, digits, _ and -, at most 64)",
    "tools[].input_schema": "an object (a JSON schema)",
    "tool_choice": '{"type": "auto", "any", "tool" (with "name") or "none"}',
    "metadata": "an object",
    "thinking": "an object",
    "service_tier": "a string",
    "output_config": 'an object, {"format": {"type": "json_schema", "schema"}, "effort"}',
    "output_config.format": '{"type": "json_schema", "schema": {...}}',
}


class WrittenCalls:
    """The arguments of the last calls this server's replies made, as the model wrote them, by
    their tool_use id: a tool_use block sent back holds them parsed (input), and only the text
    the model wrote is spliced in as its tokens (the KV reused, not evaluated again)."""

    def __init__(self, size: int = 4096):
        self.size, self._texts = size, OrderedDict()
        self._lock = threading.Lock()

    def remember(self, call_id: str, arguments: str) -> None:
        with self._lock:
            self._texts[call_id] = arguments
            while len(self._texts) > self.size:
                self._texts.popitem(last=False)

    def arguments(self, call_id: str, given: dict) -> str:
        with self._lock:
            text = self._texts.get(call_id)
        if text is not None and json.loads(text) == given:
            return text
        return json.dumps(given, ensure_ascii=False)


WRITTEN = WrittenCalls()


@dataclass(frozen=True)
class MessagesTurn:
    system_prompt: str
    turns: list[PromptMessage]
    tools: tuple[Tool, ...]
    grammar: str | None
    trigger: str | None
    calls_tools: bool


def parse_body(model: type[StrictBody], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        refusal = body_refusal(exc, EXPECTED, "Messages API")
        refusal.message = refusal.message.replace("OpenAI's Messages API", "Anthropic's "
                                                  "Messages API")
        raise refusal from None


def read_turn(request: MessagesRequest | CountRequest) -> MessagesTurn:
    if isinstance(request, MessagesRequest):
        refuse_unsupported(request, UNSUPPORTED)
    system = request.system or ""
    if not isinstance(system, str):
        system = "\n\n".join(block.text for block in system)
    turns = _turns(request.messages)
    tools = tuple(Tool(t.name, json.dumps(t.input_schema), json.dumps(
        {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                          "parameters": t.input_schema}}, ensure_ascii=False))
        for t in request.tools or [])
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        raise ApiError(400, "'tools': a tool name is offered twice", param="tools")
    output = getattr(request, "output_config", None)
    form = output.format if output is not None else None
    if tools and form is not None:
        raise ApiError(400, "'output_config.format' with 'tools' is not supported: a reply "
                       "follows one grammar", param="output_config.format")
    choice = request.tool_choice
    kind = choice.type if choice is not None else "auto"
    if kind == "tool" and (choice.name is None or choice.name not in names):
        raise ApiError(400, "'tool_choice.name' must name one of the tools", param="tool_choice")
    if not tools:
        if kind in ("any", "tool"):
            raise ApiError(400, "'tool_choice' asks for a tool call, and no 'tools' are given",
                           param="tool_choice")
        grammar = (response_grammar({"type": "json_schema", "json_schema": {
            "name": "output", "schema": form.schema_}}) if form is not None else None)
        return MessagesTurn(system, turns, (), grammar, None, False)
    use = ToolUse(tools, {"auto": "auto", "any": "required", "none": "none"}.get(
        kind, choice.name if choice is not None else "auto"),
        not (choice is not None and choice.disable_parallel_tool_use))
    try:
        grammar, lazy = tool_grammar(use)
    except SchemaError as exc:
        raise ApiError(400, f"'tools[{exc.index}].input_schema' cannot be followed: {exc}",
                       param=f"tools[{exc.index}].input_schema") from None
    return MessagesTurn(system, turns, tools, grammar, "<tool_call>" if lazy else None,
                        kind != "none")


def _turns(messages: list[AnthropicMessage]) -> list[PromptMessage]:
    turns: list[PromptMessage] = []
    calls: set[str] = set()  # the tool_use ids the next user message may answer
    for n, message in enumerate(messages):
        blocks = ([TextBlock(type="text", text=message.content)]
                  if isinstance(message.content, str) else message.content)
        if message.role == "assistant":
            if any(isinstance(b, ToolResultBlock) for b in blocks):
                raise ApiError(400, f"'messages[{n}]': a tool_result is the user's",
                               param=f"messages[{n}].content")
            text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
            used = [b for b in blocks if isinstance(b, ToolUseBlock)]
            text = reply_text(text.strip(), [ToolCall(b.name, WRITTEN.arguments(b.id, b.input))
                                             for b in used]) if used else text
            calls = {b.id for b in used}
            turns.append(PromptMessage("assistant", text))
            continue
        if any(isinstance(b, ToolUseBlock) for b in blocks):
            raise ApiError(400, f"'messages[{n}]': a tool_use is the assistant's",
                           param=f"messages[{n}].content")
        text = ""
        for block in blocks:
            if isinstance(block, ToolResultBlock):
                if block.tool_use_id not in calls:
                    raise ApiError(400, f"'messages[{n}]': a tool_result must answer a tool_use "
                                   f"of the assistant message before it ('{block.tool_use_id}')",
                                   param=f"messages[{n}].content")
                result = (block.content if isinstance(block.content, str)
                          else "".join(b.text for b in block.content))
                turns.append(PromptMessage("tool", ("Error: " if block.is_error else "")
                                           + result))
            else:
                text += block.text
        calls = set()
        if text.strip() or not turns or turns[-1].role != "tool":
            turns.append(PromptMessage("user", text))
    if turns[-1].role == "user" and not turns[-1].content.strip():
        raise ApiError(400, "the last user message is empty", param="messages")
    if turns[-1].role == "assistant" and (not turns[-1].content.strip()
                                          or "<tool_call>" in turns[-1].content):
        # A final assistant message is a prefill the reply continues: words, not tool_use.
        raise ApiError(400, f"'messages[{len(messages) - 1}]': a final assistant message is "
                       "continued: it needs text and no tool_use",
                       param=f"messages[{len(messages) - 1}]")
    if turns[0].role != "user":
        raise ApiError(400, "the first message must be the user's", param="messages")
    return turns


def sampling_of(request: MessagesRequest) -> dict:
    """complete()'s sampling keywords for a request."""
    return {"temperature": (STATELESS_TEMPERATURE if request.temperature is None
                            else request.temperature),
            **({"top_p": request.top_p} if request.top_p is not None else {}),
            **({"top_k": request.top_k} if request.top_k is not None else {}),
            "stop": tuple(request.stop_sequences or ())}
