"""The body of POST /v1/responses (OpenAI's Responses API) as pydantic models, and its items
(messages, function_call, function_call_output) read into a stateless turn's system prompt and
turns. Every field is honoured, accepted with no effect (documented in docs/api.md) or refused
by name unless it has its neutral value; a field that is not OpenAI's is refused too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from reame.inference.prompt import PromptMessage
from reame.inference.tools import SchemaError, Tool, ToolCall, ToolUse, reply_text
from reame.inference.tools import grammar as tool_grammar
from reame.web.v1.chat_request import response_grammar
from reame.web.v1.errors import ApiError, body_refusal, refuse_unsupported
from reame.web.v1.request_models import (
    MAX_MESSAGES,
    MAX_TOOLS,
    FunctionName,
    NonEmpty,
    Positive,
    StrictBody,
    Temperature,
    TopP,
)


class InputText(StrictBody):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an output_text sent back
    logprobs: list[Any] | None = None


class MessageItem(StrictBody):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None  # an output message sent back
    status: str | None = None


class FunctionCallItem(StrictBody):
    type: Literal["function_call"]
    call_id: NonEmpty
    name: FunctionName
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionOutputItem(StrictBody):
    type: Literal["function_call_output"]
    call_id: NonEmpty
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


Item = MessageItem | FunctionCallItem | FunctionOutputItem


class FunctionTool(StrictBody):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedTool(StrictBody):
    type: Literal["function"]
    name: FunctionName


class TextFormat(StrictBody):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(StrictBody):
    format: TextFormat | None = None
    verbosity: Any = None  # refused unless null or "medium"


class ResponsesRequest(StrictBody):
    model: NonEmpty
    input: str | Annotated[list[Item], Field(max_length=MAX_MESSAGES)] = ""
    instructions: str | None = None
    previous_response_id: NonEmpty | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Positive | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    store: bool | None = None
    stream: bool = False
    # Accepted: kept with the response and given back (metadata); no effect on the reply.
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None
    # Refused unless neutral (UNSUPPORTED).
    include: Any = None
    reasoning: Any = None
    background: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    conversation: Any = None
    prompt: Any = None
    stream_options: Any = None


UNSUPPORTED = {
    "include": ((None, []), "no extra output is computed here (reasoning, logprobs, ...)"),
    "reasoning": ((None, {}), "the models here have no reasoning setting"),
    "background": ((None, False), "responses are answered while the client waits"),
    "max_tool_calls": ((None,), "only function tools, called by the client"),
    "top_logprobs": ((None, 0), "log-probabilities are on /v1/chat/completions"),
    "conversation": ((None,), "send previous_response_id: conversations are not kept here"),
    "prompt": ((None,), "no stored prompt templates here"),
    "stream_options": ((None, {}), "the stream has every event already"),
}

EXPECTED = {
    "": "a JSON object",
    "model": "a model id (a string); see GET /v1/models",
    "input": f"a string or an array of at most {MAX_MESSAGES:,} items",
    "input[]": "a message {role, content}, a function_call or a function_call_output",
    "instructions": "a string",
    "previous_response_id": "a response id (a string)",
    "tools": f"an array of at most {MAX_TOOLS} function tools",
    "tools[]": 'a function tool, {"type": "function", "name", "description", "parameters"}',
    "tool_choice": '"none", "auto", "required" or {"type": "function", "name"}',
    "parallel_tool_calls": "true or false",
    "text": 'an object, {"format": {"type": "text", "json_schema" or "json_object"}}',
    "text.format": '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                   '"name", "schema", "strict"}',
    "max_output_tokens": "a positive integer",
    "temperature": "a number from 0 to 2",
    "top_p": "a number from 0 to 1",
    "store": "true or false",
    "stream": "true or false",
    "metadata": "an object of strings",
    "user": "a string",
    "safety_identifier": "a string",
    "prompt_cache_key": "a string",
    "service_tier": '"auto" or "default"',
    "truncation": '"disabled"',
}


@dataclass(frozen=True)
class ResponsesTurn:
    system_prompt: str
    turns: list[PromptMessage]
    tools: tuple[Tool, ...]
    grammar: str | None
    trigger: str | None
    calls_tools: bool


def parse(body: Any) -> ResponsesRequest:
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise body_refusal(exc, EXPECTED, "Responses API") from None
    refuse_unsupported(request, UNSUPPORTED)
    if request.text is not None and request.text.verbosity not in (None, "medium"):
        raise ApiError(400, "'text.verbosity' is not supported by this server: the models "
                       "here have no verbosity setting", param="text.verbosity",
                       code="unsupported_parameter")
    return request


def new_items(request: ResponsesRequest) -> list[dict]:
    """This request's input as items (a string is one user message)."""
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}] \
            if request.input else []
    return [item.model_dump(by_alias=True, exclude_none=True) for item in request.input]


def read_turn(request: ResponsesRequest, chain: list[dict],
              items: list[dict]) -> ResponsesTurn:
    """The turn of a request: the chain's items (each stored response's input, then its reply
    as the model wrote it), then this request's; instructions as the system prompt."""
    turns: list[PromptMessage] = []
    system: list[str] = [request.instructions] if request.instructions else []
    for stored in chain:
        _add(turns, system, stored["input"])
        turns.append(PromptMessage("assistant", stored["reply"]))
    _add(turns, system, items)
    if not turns or turns[-1].role not in ("user", "tool"):
        raise ApiError(400, "'input' needs a user message or a function_call_output to answer",
                       param="input")
    tools, grammar, trigger, calls = _tools(request)
    return ResponsesTurn("\n\n".join(system), turns, tools, grammar, trigger, calls)


def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(
        part["text"] for part in content)


def _add(turns: list[PromptMessage], system: list[str], items: list[dict]) -> None:
    for n, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            call = ToolCall(item["name"], item["arguments"])
            try:
                if not isinstance(json.loads(call.arguments), dict):
                    raise ValueError
            except ValueError:
                raise ApiError(400, f"'input[{n}].arguments' must be the JSON text of an "
                               "object", param=f"input[{n}].arguments") from None
            last = turns[-1] if turns and turns[-1].role == "assistant" else None
            if last is not None:
                turns[-1] = PromptMessage("assistant", reply_text(last.content, [call])
                                          if "<tool_call>" not in last.content
                                          else last.content + "\n" + reply_text("", [call]))
            else:
                turns.append(PromptMessage("assistant", reply_text("", [call])))
        elif kind == "function_call_output":
            turns.append(PromptMessage("tool", _text(item["output"])))
        elif item["role"] in ("system", "developer") and not turns:
            system.append(_text(item["content"]))
        else:
            role = "system" if item["role"] == "developer" else item["role"]
            turns.append(PromptMessage(role, _text(item["content"])))


def _tools(request: ResponsesRequest) -> tuple[tuple[Tool, ...], str | None, str | None, bool]:
    form = request.text.format if request.text is not None else None
    grammar = None
    if form is not None and form.type != "text":
        spec = {"name": form.name or "output", "schema": form.schema_ or {}}
        if form.strict is not None:
            spec["strict"] = form.strict
        grammar = response_grammar({"type": "json_object"} if form.type == "json_object"
                                   else {"type": "json_schema", "json_schema": spec})
    if not request.tools:
        if request.tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' asks for a tool call, and no 'tools' are given",
                           param="tool_choice")
        return (), grammar, None, False
    if grammar is not None:
        raise ApiError(400, "'text.format' with 'tools' is not supported: a reply follows one "
                       "grammar", param="text.format", code="unsupported_parameter")
    tools = tuple(Tool(t.name, json.dumps(t.parameters or {"type": "object"}), json.dumps(
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})},
        ensure_ascii=False)) for t in request.tools)
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        raise ApiError(400, "'tools': a function name is offered twice", param="tools")
    choice = request.tool_choice or "auto"
    if isinstance(choice, NamedTool):
        if choice.name not in names:
            raise ApiError(400, f"'tool_choice' names '{choice.name}', which is not among the "
                           "tools", param="tool_choice")
        choice = choice.name
    use = ToolUse(tools, choice, request.parallel_tool_calls is not False)
    try:
        made, lazy = tool_grammar(use)
    except SchemaError as exc:
        raise ApiError(400, f"'tools[{exc.index}].parameters' cannot be followed: {exc}",
                       param=f"tools[{exc.index}].parameters") from None
    return tools, made, "<tool_call>" if lazy else None, choice != "none"
