"""The body of POST /v1/chat/completions: pydantic models of every parameter of OpenAI's chat
completions, and the errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}.

Every parameter is either honoured or refused with a 400 that names it (`param`), never
accepted and ignored: a client that asked for JSON, a tool call or log-probabilities must not
believe it got them. A refused parameter is accepted at its neutral value (tools: [], logprobs:
false, response_format: {"type": "text"}, ...), as many clients send every field. A field that
is no parameter of OpenAI's is refused too. README, "OpenAI parameters", has the table."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reame.chats.conversation import STATELESS_TEMPERATURE, STATELESS_TOP_P
from reame.config.chat_settings import FIELD
from reame.config.refusals import RETRY_LOADING_S
from reame.config.setting import field_type
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

MAX_STOPS = 4
MAX_CHOICES = 16  # n: also at most the server's slots (chat_completions.py)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_MESSAGES = 2048  # messages in one request (each costs a template render and a lookup)
MAX_TOOLS = 128  # OpenAI's limit
MAX_TOOL_CALLS = 128  # calls in one assistant message


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type_, param, code)

    def response(self) -> JSONResponse:
        # A model load takes seconds: OpenAI's SDKs wait Retry-After and try again.
        retry = {"Retry-After": str(RETRY_LOADING_S)} if self.code == "model_loading" else None
        return error_response(self.status, self.message, type_=self.type, param=self.param,
                              code=self.code, headers=retry)


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


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


class _Body(BaseModel):
    """Strict, as JSON means its types: true is not 1 and "5" is not 5; a field that is not
    OpenAI's is refused by name."""
    model_config = ConfigDict(strict=True, extra="forbid")


Role = Literal["system", "developer", "user", "assistant", "tool"]
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Positive = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]


# A chat setting's type with its range, as its declaration gives it (chat_settings.FIELD).
Temperature = field_type(FIELD["temperature"])
TopP = field_type(FIELD["top_p"])
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class CalledFunction(_Body):
    name: FunctionName
    arguments: str  # JSON text of an object, as the reply wrote it


class CallIn(_Body):
    id: NonEmpty
    type: Literal["function"]
    function: CalledFunction


class Message(_Body):
    role: Role
    content: str | list[TextPart] | None = None  # None only beside an assistant's tool_calls
    tool_calls: Annotated[list[CallIn], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: NonEmpty | None = None  # a tool message's: the call it answers
    # OpenAI's, refused when set (_conversation): no template here has a place for them.
    name: Any = None
    refusal: Any = None
    audio: Any = None


class FunctionDef(_Body):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None  # the arguments always follow the schema here (a grammar)


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: FunctionName


class NamedChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Body):
    include_usage: bool = False


class ChatRequest(_Body):
    """The body of POST /v1/chat/completions, as far as this server reads it. A null sampling
    field means its default (some clients send every field)."""
    model: NonEmpty
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: Positive | None = None
    max_completion_tokens: Positive | None = None  # max_tokens' newer name
    temperature: Temperature | None = None
    top_p: TopP | None = None
    # An empty stop string would end every reply before its first word.
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
                     Annotated[float, Field(ge=-100, le=100)]] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # Accepted, no effect on the reply: identifiers for the provider's own records (Reame
    # keeps none) and a hint for its prompt cache (Reame's finds the prompt by its tokens).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: Any = None  # checked by response_grammar()
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's, refused unless neutral (UNSUPPORTED).
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None


# OpenAI's parameters this server does not honour: the values that change nothing (accepted),
# and why any other value is refused. README's table is made from the same words.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": ((None, []), "function calling is deprecated by OpenAI: send 'tools'"),
    "function_call": ((None, "none", "auto"),
                      "function calling is deprecated by OpenAI: send 'tool_choice'"),
    "modalities": ((None, ["text"]), "the models here write text only"),
    "audio": ((None,), "the models here write text only"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "the models here have no reasoning setting"),
    "verbosity": ((None,), "the models here have no verbosity setting"),
    "web_search_options": ((None,), "this server does not search the web"),
    "store": ((None, False), "this server does not store completions made through /v1 (a "
              "stored chat is sent with the X-Reame-Chat header)"),
    "metadata": ((None, {}), "it tags stored completions, which this server does not keep"),
    "service_tier": ((None, "auto", "default"), "this server has one tier"),
}


# What each field must be, by its path with list indices as [] ("" is the body itself).
EXPECTED = {
    "": "a JSON object",
    "model": "a model id (a string); see GET /v1/models",
    "messages": f"a non-empty array of at most {MAX_MESSAGES:,} messages",
    "messages[]": "an object with a role and content",
    "messages[].role": f"one of {', '.join(get_args(Role))}",
    "messages[].content": 'a string or an array of text parts, {"type": "text", "text": ...}',
    "messages[].tool_calls": f"an array of at most {MAX_TOOL_CALLS} tool calls",
    "messages[].tool_calls[]": 'a tool call, {"id", "type": "function", "function": {"name", '
                               '"arguments"}}',
    "messages[].tool_calls[].id": "a non-empty string",
    "messages[].tool_calls[].type": '"function"',
    "messages[].tool_calls[].function": 'an object, {"name", "arguments"}',
    "messages[].tool_calls[].function.name": "a function name (letters, digits, _ and -, at "
                                             "most 64)",
    "messages[].tool_calls[].function.arguments": "a string (the arguments' JSON)",
    "messages[].tool_call_id": "a non-empty string (the id of the call this answers)",
    "tools": f"an array of at most {MAX_TOOLS} tools",
    "tools[]": 'a tool, {"type": "function", "function": {"name", "description", '
               '"parameters", "strict"}}',
    "tools[].type": '"function"',
    "tools[].function": 'an object, {"name", "description", "parameters", "strict"}',
    "tools[].function.name": "a function name (letters, digits, _ and -, at most 64)",
    "tools[].function.description": "a string",
    "tools[].function.parameters": "an object (a JSON schema)",
    "tools[].function.strict": "true or false",
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name"}}',
    "parallel_tool_calls": "true or false",
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "temperature": f"a number {FIELD['temperature'].allowed()}",
    "top_p": f"a number {FIELD['top_p'].allowed()}",
    "stop": f"a non-empty string or up to {MAX_STOPS} of them",
    "seed": "an integer",
    "logit_bias": "an object of token ids (strings of digits) to numbers from -100 to 100",
    "n": f"an integer from 1 to {MAX_CHOICES}",
    "stream": "true or false",
    "stream_options": 'an object, {"include_usage": true or false}',
    "stream_options.include_usage": "true or false",
    "frequency_penalty": "a number from -2 to 2",
    "presence_penalty": "a number from -2 to 2",
    "user": "a string",
    "safety_identifier": "a string",
    "prompt_cache_key": "a string",
    "logprobs": "true or false",
    "top_logprobs": f"an integer from 0 to {MAX_TOP_LOGPROBS}",
}


def parse_request(body: Any, model_ids: list[str]) -> CompletionRequest:
    """Validate a /v1/chat/completions body; ApiError (400/404) says what is wrong."""
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None
    if request.model not in model_ids:
        raise ApiError(404, f"The model '{request.model}' does not exist; this server has: "
                       f"{', '.join(model_ids) or 'none loaded'}", param="model",
                       code="model_not_found")
    _refuse_unsupported(request)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "'stream_options' is only for streamed requests (stream: true)",
                       param="stream_options")
    if request.top_logprobs is not None and not request.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    system, turns = _conversation(request.messages)
    stop = request.stop or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    grammar, trigger = response_grammar(request.response_format), None
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
        stop, request.seed, request.stream,
        request.stream_options is not None and request.stream_options.include_usage,
        tuple((int(token), bias) for token, bias in (request.logit_bias or {}).items()),
        request.frequency_penalty or 0.0, request.presence_penalty or 0.0,
        (request.top_logprobs or 0) if request.logprobs else None,
        grammar, trigger, use.tools if use is not None else (),
        use is not None and use.choice != "none", request.n)


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


def _refuse_unsupported(request: BaseModel, unsupported: dict = UNSUPPORTED) -> None:
    for param, (neutral, why) in unsupported.items():
        value = getattr(request, param)
        if not any(value == ok and type(value) is type(ok) for ok in neutral):
            raise ApiError(400, f"'{param}' is not supported by this server: {why}. It is "
                           "refused rather than ignored.", param=param,
                           code="unsupported_parameter")


def _refusal(exc: ValidationError, expected: dict[str, str] = EXPECTED,
             api: str = "chat completions") -> ApiError:
    """The first of pydantic's errors in this API's words: the field's path as the client wrote
    it ("messages[2].role") and what it must be. Pydantic's own text names its internals (class
    names, a union's branches)."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    if error["type"] == "extra_forbidden":
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                        for part in error["loc"]).lstrip(".")
        return ApiError(400, f"'{where}' is not a parameter of OpenAI's {api}: it "
                        "is refused rather than ignored", param=where,
                        code="unknown_parameter")
    param = ""
    for part in error["loc"]:  # down to the deepest field: not into a union's branches
        longer = f"{param}[{part}]" if isinstance(part, int) else f"{param}.{part}".lstrip(".")
        if _key(longer) not in expected:  # e.g. "stop.list[constrained-str]"
            break
        param = longer
    name, wanted = f"'{param}'" if param else "the request body", expected[_key(param)]
    verb = "is required:" if error["type"] == "missing" else "must be"
    return ApiError(400, f"{name} {verb} {wanted}", param=param or None)


def _key(param: str) -> str:
    return re.sub(r"\[\d+\]", "[]", param)  # messages[2].role -> messages[].role


MESSAGE_FIELDS = {
    "name": "the chat templates here have no place for a participant's name",
    "refusal": "a refusal is an OpenAI model's own field",
    "audio": "the models here write text only",
}


def _conversation(messages: list[Message]) -> tuple[list[str], list[PromptMessage]]:
    """The system texts and the turns, in the order a chat template can render."""
    system, turns = [], []
    calls: set[str] = set()  # the ids of the calls the tool messages may answer
    for n, message in enumerate(messages):
        for field in MESSAGE_FIELDS:
            if getattr(message, field) is not None:
                raise ApiError(400, f"'messages[{n}].{field}' is not supported by this server: "
                               f"{MESSAGE_FIELDS[field]}. It is refused rather than ignored.",
                               param=f"messages[{n}].{field}", code="unsupported_parameter")
        _check_tool_fields(n, message, calls)
        content = message.content
        text = ("" if content is None else content if isinstance(content, str)
                else "".join(part.text for part in content))
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


def _check_tool_fields(n: int, message: Message, calls: set[str]) -> None:
    """tool_calls only on an assistant's message; a tool's result answers a call of the
    assistant message before it, by its id; content is null only beside tool calls."""
    where = f"messages[{n}]"
    if message.tool_calls is not None and message.role != "assistant":
        raise ApiError(400, f"'{where}.tool_calls' is for assistant messages",
                       param=f"{where}.tool_calls")
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ApiError(400, f"'{where}.tool_call_id' is required: the id of the call this "
                           "result answers", param=f"{where}.tool_call_id")
        if message.tool_call_id not in calls:
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
