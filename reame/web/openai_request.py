"""The body of POST /v1/chat/completions: pydantic models of what this server reads, and the
errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reame.chats.conversation import STATELESS_TEMPERATURE, STATELESS_TOP_P
from reame.config.chat_settings import FIELD
from reame.config.refusals import RETRY_LOADING_S
from reame.config.setting import field_type
from reame.inference.prompt import PromptMessage

MAX_STOPS = 4
MAX_MESSAGES = 2048  # messages in one request (each costs a template render and a lookup)


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


class _Body(BaseModel):
    """Strict, as JSON means its types: true is not 1 and "5" is not 5. Fields this server does
    not read are ignored: OpenAI's clients send many."""
    model_config = ConfigDict(strict=True, extra="ignore")


Role = Literal["system", "developer", "user", "assistant"]
Positive = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]


# A chat setting's type with its range, as its declaration gives it (chat_settings.FIELD).
Temperature = field_type(FIELD["temperature"])
TopP = field_type(FIELD["top_p"])


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Role
    content: str | list[TextPart]


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
    n: Annotated[int, Field(ge=1, le=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


# What each field must be, by its path with list indices as [] ("" is the body itself).
EXPECTED = {
    "": "a JSON object",
    "model": "a model id (a string); see GET /v1/models",
    "messages": f"a non-empty array of at most {MAX_MESSAGES:,} messages",
    "messages[]": "an object with a role and content",
    "messages[].role": f"one of {', '.join(get_args(Role))}",
    "messages[].content": 'a string or an array of text parts, {"type": "text", "text": ...}',
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "temperature": f"a number {FIELD['temperature'].allowed()}",
    "top_p": f"a number {FIELD['top_p'].allowed()}",
    "stop": f"a non-empty string or up to {MAX_STOPS} of them",
    "seed": "an integer",
    "logit_bias": "an object of token ids (strings of digits) to numbers from -100 to 100",
    "n": "1 (one choice per request)",
    "stream": "true or false",
    "stream_options": 'an object, {"include_usage": true or false}',
    "stream_options.include_usage": "true or false",
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
    system, turns = _conversation(request.messages)
    stop = request.stop or ()
    return CompletionRequest(
        request.model, "\n\n".join(system), turns,
        request.max_completion_tokens or request.max_tokens,
        STATELESS_TEMPERATURE if request.temperature is None else request.temperature,
        STATELESS_TOP_P if request.top_p is None else request.top_p,
        (stop,) if isinstance(stop, str) else tuple(stop), request.seed, request.stream,
        request.stream_options is not None and request.stream_options.include_usage,
        tuple((int(token), bias) for token, bias in (request.logit_bias or {}).items()))


def _refusal(exc: ValidationError) -> ApiError:
    """The first of pydantic's errors in this API's words: the field's path as the client wrote
    it ("messages[2].role") and what it must be. Pydantic's own text names its internals (class
    names, a union's branches)."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    param = ""
    for part in error["loc"]:  # down to the deepest field: not into a union's branches
        longer = f"{param}[{part}]" if isinstance(part, int) else f"{param}.{part}".lstrip(".")
        if _key(longer) not in EXPECTED:  # e.g. "stop.list[constrained-str]"
            break
        param = longer
    name, expected = f"'{param}'" if param else "the request body", EXPECTED[_key(param)]
    verb = "is required:" if error["type"] == "missing" else "must be"
    return ApiError(400, f"{name} {verb} {expected}", param=param or None)


def _key(param: str) -> str:
    return re.sub(r"\[\d+\]", "[]", param)  # messages[2].role -> messages[].role


def _conversation(messages: list[Message]) -> tuple[list[str], list[PromptMessage]]:
    """The system texts and the turns, in the order a chat template can render."""
    system, turns = [], []
    for n, message in enumerate(messages):
        content = message.content
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        if message.role not in ("system", "developer"):
            turns.append(PromptMessage(message.role, text))
        elif turns:
            raise ApiError(400, f"messages[{n}]: system messages go before the conversation",
                           param=f"messages[{n}]")
        else:
            system.append(text)
    if not turns or turns[-1].role != "user":
        raise ApiError(400, "the last message must be the user's", param="messages")
    if not turns[-1].content.strip():
        raise ApiError(400, "the last user message is empty", param="messages")
    return system, turns
