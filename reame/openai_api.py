"""OpenAI-compatible endpoints on the app's own server: GET /v1/models, POST /v1/chat/completions.

Stateless clients resend the whole conversation each time; the KV cache finds it anyway (the
request's tokens are looked up by chained block hashes among the KV files, tokens checked), so
the second request of a conversation evaluates only its new tokens. A request with the header
`X-Reame-Chat: <chat id>` is instead a turn of that stored chat: its last user message is added
to the chat (which keeps its own history and settings) and the exchange shows in the page.

Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the status a
client expects: 400 bad request, 401 no or wrong key, 404 unknown model or chat, 413 too long,
503 while a model loads or when none is loaded.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from .accounts import Accounts
from .chat import (ChatError, ChatNotFound, ChatService, EmptyMessage, MessageTooLong,
                   NoModel, TurnUpdate)
from .prompt import Turn

log = logging.getLogger(__name__)

CHAT_HEADER = "X-Reame-Chat"
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more text than any context here holds
MAX_STOPS = 4
MAX_MESSAGES = 2048  # messages in one request (each costs a template render and a lookup)
LOADING_RETRY_S = 2


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type_, param, code)

    def response(self) -> JSONResponse:
        # A model load takes seconds: OpenAI's SDKs wait Retry-After and try again.
        retry = {"Retry-After": str(LOADING_RETRY_S)} if self.code == "model_loading" else None
        return error_response(self.status, self.message, type_=self.type, param=self.param,
                              code=self.code, headers=retry)


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


INTERNAL_ERROR = "Internal error: the server could not answer this request (see its log)."


def internal_error(_request: Request, _exc: Exception) -> JSONResponse:
    """The app's handler for any unexpected exception: a 500 that says nothing of it (the
    server logs the traceback)."""
    return error_response(500, INTERNAL_ERROR, type_="server_error", code="internal_error")


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    system_prompt: str
    turns: list[Turn]
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool


class _Body(BaseModel):
    """Strict, as JSON means its types: true is not 1 and "5" is not 5. Fields this server does
    not read are ignored: OpenAI's clients send many."""
    model_config = ConfigDict(strict=True, extra="ignore")


Role = Literal["system", "developer", "user", "assistant"]
Positive = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]


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
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: str | Annotated[list[NonEmpty], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = None
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
    "temperature": "a number from 0 to 2",
    "top_p": "a number above 0, at most 1",
    "stop": f"a string or up to {MAX_STOPS} non-empty strings",
    "seed": "an integer",
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
        1.0 if request.temperature is None else request.temperature,
        1.0 if request.top_p is None else request.top_p,
        (stop,) if isinstance(stop, str) else tuple(stop), request.seed, request.stream,
        request.stream_options is not None and request.stream_options.include_usage)


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


def _conversation(messages: list[Message]) -> tuple[list[str], list[Turn]]:
    """The system texts and the turns, in the order a chat template can render."""
    system, turns = [], []
    for n, message in enumerate(messages):
        content = message.content
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        if message.role not in ("system", "developer"):
            turns.append(Turn(message.role, text))
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


def build_router(service: ChatService, accounts: Accounts | None) -> APIRouter:
    """The /v1 routes. With accounts, every request needs `Authorization: Bearer <key>`."""
    router = APIRouter(prefix="/v1")

    def caller(request: Request) -> str | None:
        if accounts is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>' (make one "
                           "with `python app.py addkey NAME`)", type_="authentication_error",
                           code="missing_api_key")
        user = accounts.user_id(accounts.user_for_key(key.strip()))
        if user is None:
            raise ApiError(401, "Incorrect API key provided", type_="authentication_error",
                           code="invalid_api_key")
        return user

    def model_ids() -> list[str]:
        return [service.engine.name] if service.engine is not None else []

    def ready() -> None:
        if service.loading:
            raise ApiError(503, "A model is loading; try again in a moment",
                           type_="server_error", code="model_loading")
        if service.engine is None:
            raise ApiError(503, f"No model is loaded: {service.load_error}",
                           type_="server_error", code="no_model")

    @router.get("/models")
    def list_models(request: Request):
        try:
            caller(request)
        except ApiError as exc:
            return exc.response()
        created = int(service.engine.model_path.stat().st_mtime) if service.engine else 0
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "reame"}
            for name in model_ids()]}

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        try:
            user = caller(request)
            body = await _read_json(request)
            ready()
            parsed = parse_request(body, model_ids())
            chat_id = _chat_header(request)
            if chat_id is not None:
                service.get_chat(chat_id, user)  # 404 now, not in the middle of a stream
            # Tokenizing and the first update, in a worker thread (it waits for the model):
            # refusals (too long, empty, no model) raise here, before any byte is sent.
            updates, first = await run_in_threadpool(_first, _starter(service, parsed,
                                                                      chat_id, user))
        except ApiError as exc:
            return exc.response()
        except ChatNotFound as exc:
            return error_response(404, str(exc), param=CHAT_HEADER, code="chat_not_found")
        except MessageTooLong as exc:
            return error_response(413, str(exc), param="messages", code="context_length_exceeded")
        except (EmptyMessage, ChatError) as exc:
            return error_response(400, str(exc))
        except NoModel as exc:
            return error_response(503, str(exc), type_="server_error", code="no_model")
        updates = itertools.chain([first], updates)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if parsed.stream:
            return StreamingResponse(_sse(updates, completion_id, parsed),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await run_in_threadpool(_whole, updates, completion_id, parsed)

    return router


async def _read_json(request: Request) -> Any:
    # JSON only: a form or text/plain body is what another site's page can send without
    # asking first (no CORS preflight).
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, "the request body must be JSON, sent with Content-Type: "
                       "application/json", code="unsupported_media_type")
    # One check for bodies with and without a Content-Length: count what arrives.
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is over {MAX_BODY_BYTES:,} bytes",
                           code="request_too_large")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None


def _first(start: Callable[[], Iterator[TurnUpdate]]) -> tuple[Iterator[TurnUpdate],
                                                                TurnUpdate]:
    updates = start()
    return updates, next(updates)


def _chat_header(request: Request) -> int | None:
    value = request.headers.get(CHAT_HEADER)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ApiError(400, f"{CHAT_HEADER} must be a chat id (a number)", param=CHAT_HEADER)
    return int(value)


def _starter(service: ChatService, parsed: CompletionRequest, chat_id: int | None,
             user: str | None) -> Callable[[], Iterator[TurnUpdate]]:
    if chat_id is not None:
        return lambda: service.send(
            chat_id, parsed.turns[-1].content, user=user, seed=parsed.seed,
            max_tokens=parsed.max_tokens, stop=parsed.stop)
    return lambda: service.complete(
        parsed.system_prompt, parsed.turns, max_tokens=parsed.max_tokens,
        temperature=parsed.temperature, top_p=parsed.top_p, seed=parsed.seed, stop=parsed.stop,
        user=user)


def _usage(done: TurnUpdate) -> dict:
    s = done.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated,
            # how much of the prompt was not recomputed, and from where (not in OpenAI's API)
            "prompt_tokens_details": {"cached_tokens": s.reused}}


def _extra(done: TurnUpdate) -> dict:
    s = done.stats
    return {"reused": s.reused, "source": s.source, "prefilled": s.prefilled,
            "first_token_s": round(s.first_token_s, 4), "chat_id": done.chat_id,
            "first_logits": s.first_logits}


def _whole(updates: Iterator[TurnUpdate], completion_id: str,
           parsed: CompletionRequest) -> JSONResponse:
    done = None
    for update in updates:
        done = update
    return JSONResponse({
        "id": completion_id, "object": "chat.completion", "created": int(time.time()),
        "model": parsed.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                     "finish_reason": done.finish_reason, "logprobs": None}],
        "usage": _usage(done), "reame": _extra(done),
    })


def _sse(updates: Iterator[TurnUpdate], completion_id: str,
         parsed: CompletionRequest) -> Iterator[str]:
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        body = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                "model": parsed.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                             "logprobs": None}], **extra}
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    sent = ""
    try:
        for update in updates:
            text = update.text
            if text.startswith(sent) and len(text) > len(sent):
                yield chunk({"content": text[len(sent):]})
                sent = text
            if update.done:
                yield chunk({}, update.finish_reason, reame=_extra(update))
                if parsed.include_usage:
                    yield ("data: " + json.dumps({
                        "id": completion_id, "object": "chat.completion.chunk",
                        "created": created, "model": parsed.model, "choices": [],
                        "usage": _usage(update)}) + "\n\n")
    except ChatError as exc:  # e.g. the chat was deleted while it answered
        yield _sse_error(str(exc), None)
    except Exception:  # the answer has started: say so in the stream, log the rest
        log.exception("a streamed completion failed")
        yield _sse_error(INTERNAL_ERROR, "internal_error")
    yield "data: [DONE]\n\n"


def _sse_error(message: str, code: str | None) -> str:
    return "data: " + json.dumps({"error": {"message": message, "type": "server_error",
                                            "param": None, "code": code}}) + "\n\n"
