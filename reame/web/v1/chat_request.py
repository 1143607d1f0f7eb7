"""The body of POST /v1/chat/completions read into a CompletionRequest: its conversation, its
sampling, its tools and the grammar a reply follows.

Every parameter is either honoured or refused with a 400 that names it (`param`), never
accepted and ignored: a client that asked for JSON, a tool call or log-probabilities must not
believe it got them. A refused parameter is accepted at its neutral value (tools: [], logprobs:
false, response_format: {"type": "text"}, ...), as many clients send every field. A field that
is no parameter of OpenAI's is refused too. The body's models are in request_models.py, the
table of parameters in parameters.py (docs/api.md, "OpenAI parameters", has it), the errors in
errors.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from reame.chats.conversation import STATELESS_TEMPERATURE, STATELESS_TOP_P
from reame.inference.grammar_bounds import check_schema_cost
from reame.inference.prompt import PromptMessage
from reame.inference.tools import (
    CALL_OPEN,
    SchemaError,
    Tool,
    ToolCall,
    ToolUse,
    reply_text,
)
from reame.inference.tools import grammar as tool_grammar
from reame.web.v1.errors import ApiError, body_refusal, check_model, refuse_unsupported
from reame.web.v1.parameters import EXPECTED, MESSAGE_FIELDS, UNSUPPORTED, llama_seed
from reame.web.v1.request_models import CallIn, ChatRequest, Message, NamedChoice


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    system_prompt: str
    turns: list[PromptMessage]
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_logprobs: int | None = None  # None: no log-probabilities; else how many alternatives
    grammar: str | None = None  # GBNF the reply must follow (response_format, tools), or None
    grammar_trigger: str | None = None  # where a lazy grammar starts (a tool call begun)
    tools: tuple[Tool, ...] = ()
    calls_tools: bool = False  # the reply may call tools: its text is split into calls
    n: int = 1  # choices
    # The tool messages the conversation ends with: (tool_call_id, content) each (what a turn
    # of a stored chat adds to it).
    results: tuple[tuple[str, str], ...] = ()
    # A stored chat's turn: its calls' ids start with this (chats.messages.call_id), the same
    # in the answer and in the chat. None: ids of their own.
    call_id_prefix: str | None = None
    formatted: bool = False  # response_format asks for JSON (its grammar, or a call's stop)


def parse_request(body: Any, model_ids: list[str], stored: bool = False) -> CompletionRequest:
    """Validate a /v1/chat/completions body; ApiError (400/404) says what is wrong. stored: a
    turn of a stored chat (X-Reame-Chat), whose tool results answer the calls the chat holds
    (checked there), not calls in the body."""
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise body_refusal(exc, EXPECTED, "chat completions") from None
    check_model(request.model, model_ids)
    refuse_unsupported(request, UNSUPPORTED)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "'stream_options' is only for streamed requests (stream: true)",
                       param="stream_options")
    if request.top_logprobs is not None and not request.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    system, turns = _conversation(request.messages, stored)
    stop = request.stop or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    response_format_grammar = response_grammar(request.response_format)
    grammar, trigger = response_format_grammar, None
    use = tool_use(request)
    if use is not None and use.choice == "none" and grammar is not None:
        stop += (CALL_OPEN,)  # JSON asked for: it holds the reply; a call begun ends it
    elif use is not None:
        if grammar is not None:
            raise ApiError(400, "'response_format' with 'tools' is not supported: a reply "
                           "follows one grammar (send 'tool_choice': 'none' to ask for JSON "
                           "text)", param="response_format", code="unsupported_parameter")
        grammar, lazy = _tool_grammar(use)
        trigger = CALL_OPEN if lazy else None  # the grammar holds a call begun
    return CompletionRequest(
        request.model, "\n\n".join(system), turns,
        request.max_completion_tokens or request.max_tokens,
        STATELESS_TEMPERATURE if request.temperature is None else request.temperature,
        STATELESS_TOP_P if request.top_p is None else request.top_p,
        stop, llama_seed(request.seed), request.stream,
        request.stream_options is not None and request.stream_options.include_usage,
        tuple((int(token), bias) for token, bias in (request.logit_bias or {}).items()),
        request.frequency_penalty or 0.0, request.presence_penalty or 0.0,
        (request.top_logprobs or 0) if request.logprobs else None,
        grammar, trigger, use.tools if use is not None else (),
        use is not None and use.choice != "none", request.n,
        tuple((m.tool_call_id, _text(m)) for m in _trailing_tools(request.messages)),
        formatted=response_format_grammar is not None)


def tool_use(request: ChatRequest) -> ToolUse | None:
    """The tools offered and how the reply may call them; None when none are offered."""
    choice = request.tool_choice
    if not request.tools:
        if choice is None or choice in ("none", "auto"):
            return None
        raise ApiError(400, "'tool_choice' asks for a tool call, and no 'tools' are given",
                       param="tool_choice")
    tools = tuple(
        Tool(t.function.name, json.dumps(t.function.parameters or {"type": "object"}),
             json.dumps({"type": "function", "function": t.function.model_dump(
                 exclude_none=True)}, ensure_ascii=False))
        for t in request.tools)
    names = [t.name for t in tools]
    for n, name in enumerate(names):
        if name in names[:n]:
            raise ApiError(400, f"'tools[{n}].function.name': '{name}' is offered twice",
                           param=f"tools[{n}].function.name")
    if isinstance(choice, NamedChoice):
        if choice.function.name not in names:
            raise ApiError(400, f"'tool_choice' names '{choice.function.name}', which is not "
                           f"among the tools ({', '.join(names)})", param="tool_choice")
        choice = choice.function.name
    parallel = True if request.parallel_tool_calls is None else request.parallel_tool_calls
    return ToolUse(tools, choice or "auto", parallel)


def _tool_grammar(use: ToolUse) -> tuple[str, bool]:
    try:
        made = tool_grammar(use)
    except SchemaError as exc:
        raise ApiError(400, f"'tools[{exc.index}].function.parameters' cannot be followed: "
                       f"{exc}", param=f"tools[{exc.index}].function.parameters") from None
    return made


def response_grammar(response_format: Any) -> str | None:
    """The llama.cpp grammar (GBNF) that holds the reply to response_format: any JSON object
    for json_object, the schema's JSON for json_schema (llama-cpp-python's converter); None
    for text. ApiError for anything else."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object" and set(response_format) == {"type"}:
        return JSON_GBNF
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)
            and set(response_format) == {"type", "json_schema"}
            and set(spec) <= {"name", "description", "schema", "strict"}):
        try:
            check_schema_cost(spec["schema"])  # before the converter writes it out
            return json_schema_to_gbnf(json.dumps(spec["schema"]))
        except Exception as exc:  # the converter's own words: what it cannot express
            raise ApiError(400, f"'response_format.json_schema.schema' cannot be followed: "
                           f"{str(exc)[:200]}", param="response_format") from None
    raise ApiError(400, "'response_format' must be {\"type\": \"text\"}, {\"type\": "
                   "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"name\", "
                   "\"schema\", \"strict\"}}", param="response_format")


def _text(message: Message) -> str:
    content = message.content
    return ("" if content is None else content if isinstance(content, str)
            else "".join(part.text for part in content))


def _trailing_tools(messages: list[Message]) -> list[Message]:
    """The tool messages the conversation ends with."""
    n = len(messages)
    while n and messages[n - 1].role == "tool":
        n -= 1
    return messages[n:]


def _conversation(messages: list[Message],
                  stored: bool = False) -> tuple[list[str], list[PromptMessage]]:
    """The system texts and the turns, in the order a chat template can render. stored: the
    calls tool messages answer are the stored chat's (not checked here)."""
    system, turns = [], []
    calls: set[str] | None = set()  # the ids of the calls the tool messages may answer
    for n, message in enumerate(messages):
        for field in MESSAGE_FIELDS:
            if getattr(message, field) is not None:
                raise ApiError(400, f"'messages[{n}].{field}' is not supported by this server: "
                               f"{MESSAGE_FIELDS[field]}. It is refused rather than ignored.",
                               param=f"messages[{n}].{field}", code="unsupported_parameter")
        _check_tool_fields(n, message, None if stored else calls)
        text = _text(message)
        if message.role == "assistant" and message.tool_calls:
            text = reply_text(text, [_call(n, m, call)
                                     for m, call in enumerate(message.tool_calls)])
            calls = {call.id for call in message.tool_calls}
        elif message.role != "tool":
            calls = set()
        if message.role not in ("system", "developer"):
            turns.append(PromptMessage(message.role, text))
        elif turns:  # later on: where the template allows one (prompt.py)
            turns.append(PromptMessage("system", text))
        else:
            system.append(text)
    if not turns:
        if not "".join(system).strip():
            raise ApiError(400, "the conversation is empty: its system messages have no text",
                           param="messages")
        return system, turns  # only system messages: answered, as OpenAI and vLLM do
    if not any(t.role in ("user", "tool") for t in turns):
        raise ApiError(400, "the conversation needs a user message", param="messages")
    last = turns[-1]
    if last.role == "user" and not last.content.strip():
        raise ApiError(400, "the last user message is empty", param="messages")
    if last.role == "assistant" and (messages[-1].tool_calls or not last.content):
        # A final assistant message is continued (a prefilled reply): its words, not calls.
        raise ApiError(400, "a final assistant message is continued: it needs text and no "
                       "tool_calls", param=f"messages[{len(messages) - 1}]")
    return system, turns


def _check_tool_fields(n: int, message: Message, calls: set[str] | None) -> None:
    """tool_calls only on an assistant's message; a tool's result answers a call of the
    assistant message before it, by its id (calls; None: checked elsewhere); content is null
    only beside tool calls."""
    where = f"messages[{n}]"
    if message.tool_calls is not None and message.role != "assistant":
        raise ApiError(400, f"'{where}.tool_calls' is for assistant messages",
                       param=f"{where}.tool_calls")
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ApiError(400, f"'{where}.tool_call_id' is required: the id of the call this "
                           "result answers", param=f"{where}.tool_call_id")
        if calls is not None and message.tool_call_id not in calls:
            raise ApiError(400, f"'{where}': a tool's result must follow the assistant message "
                           f"that made the call '{message.tool_call_id}'",
                           param=f"{where}.tool_call_id")
    elif message.tool_call_id is not None:
        raise ApiError(400, f"'{where}.tool_call_id' is for tool messages",
                       param=f"{where}.tool_call_id")
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        raise ApiError(400, f"'{where}.content' is required (null only beside an assistant's "
                       "tool_calls)", param=f"{where}.content")


def _call(n: int, m: int, call: CallIn) -> ToolCall:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ApiError(400, f"'messages[{n}].tool_calls[{m}].function.arguments' must be the "
                       "JSON text of an object", param=f"messages[{n}].tool_calls[{m}].function"
                       ".arguments")
    return ToolCall(call.function.name, call.function.arguments)
