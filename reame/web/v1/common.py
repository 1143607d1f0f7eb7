"""What the /v1 routes share (chat completions, text completions, Messages, Responses): a
turn's opening (open_turn: who asks, the JSON body, readiness, the turn started and its first
update, or the refusal), noticing a client that hangs up, a request refused or a turn ended in
OpenAI's shape and status, the usage and Reame's own figures of an answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import xxhash
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from reame.chats.service import (
    ChatError,
    ChatNotFound,
    ChatService,
    MessageTooLong,
    NoModel,
    ServerBusy,
    TurnUpdate,
)
from reame.config.refusals import RETRY_LOADING_S, RETRY_NO_MODEL_S
from reame.inference.turn_stream import TurnStream
from reame.web.http.guard import MAX_V1_BODY_BYTES
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.errors import ApiError, error_response

CHAT_HEADER = "X-Reame-Chat"


INTERNAL_ERROR = "Internal error: the server could not answer this request (see its log)."


def internal_error(_request: Request, _exc: Exception) -> JSONResponse:
    """The app's handler for any unexpected exception: a 500 that says nothing of it (the
    server logs the traceback)."""
    return error_response(500, INTERNAL_ERROR, type_="server_error", code="internal_error")


def system_fingerprint(service: ChatService) -> str:
    """OpenAI's system_fingerprint: the same for the same model file, KV layout and llama.cpp
    build (what a reply's bits depend on besides the request and the CPU)."""
    engine = service.engine
    return "fp_" + xxhash.xxh3_64_hexdigest((engine.kv_fingerprint if engine else "").encode())[:10]


Context = TypeVar("Context")


@dataclass
class Opened(Generic[Context]):
    """A turn under way: who asked, its updates (the first in hand), the future that ends
    when the client hangs up, and what the route's prepare returned beside the start."""
    user: str | None
    updates: UpdateFeed
    first: TurnUpdate
    gone: asyncio.Future
    context: Context


Prepare = Callable[[str | None, Any], Awaitable[tuple[Callable[[], TurnStream], Context]]]


async def open_turn(request: Request, caller: Callable[[Request], str | None],
                    ready: Callable[[], None], prepare: Prepare,
                    prompt_param: str) -> Opened | Response:
    """The opening every /v1 turn shares: the caller (its key), the JSON body, the server
    ready, then prepare(user, body) (the route's own reading of the body: a start for the turn
    and any context); the turn started and its first update, which waits for a slot and the
    prompt. A refusal (a bad body, too long, empty, no model, full) is the response, before any
    byte of an answer is sent; 499 when the client hung up meanwhile."""
    try:
        user = caller(request)
        body = await read_json(request)
    except ApiError as exc:
        return exc.response()
    # From here the request has nothing more to read: the next message is its end.
    gone = asyncio.ensure_future(client_gone(request))
    try:
        ready()
        start, context = await prepare(user, body)
        updates = await started(start, gone)
        first = await updates.next()
    except (ApiError, ChatError, ChatNotFound) as exc:
        return refused(gone, turn_refusal(exc, prompt_param))
    except BaseException:
        gone.cancel()
        raise
    if first is None:  # the client hung up: nobody reads an answer
        gone.cancel()
        return Response(status_code=499)
    return Opened(user, updates, first, gone, context)


STOPPED_BY_SERVER = ("the reply was stopped by the server (a model switch or a shutdown) before "
                     "its end; what came is what it wrote")


async def started(start: Callable[[], TurnStream], gone: asyncio.Future) -> UpdateFeed:
    """A turn started in a worker thread (its refusals raise here), its updates in the event
    loop, and stopped when the client hangs up (gone)."""
    feed = UpdateFeed(await run_in_threadpool(start))
    gone.add_done_callback(lambda _: feed.interrupt())
    return feed


def refused(gone: asyncio.Future, response: JSONResponse) -> JSONResponse:
    gone.cancel()
    return response


async def last_update(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
                      prompt_param: str) -> TurnUpdate | Response:
    """A turn answered whole: its last update, once it comes; or the response for a turn that
    ended without it (499: the client hung up; 503: a model switch or a shutdown stopped it;
    a refusal met after the turn waited in line, e.g. a full line for the model switched to:
    its status, as if met at once)."""
    try:
        done = await ended(updates, first)
    except (ApiError, ChatError, ChatNotFound) as exc:
        return turn_refusal(exc, prompt_param)
    finally:
        gone.cancel()
        updates.interrupt()
    return done if done is not None else cut_short(gone)


async def ended(feed: UpdateFeed, first: TurnUpdate | None) -> TurnUpdate | None:
    """A turn's last update (after first, when given), or None when it ended without one."""
    update = first if first is not None else await feed.next()
    while update is not None and not update.done:
        update = await feed.next()
    return update


def cut_short(gone: asyncio.Future) -> Response:
    """The response for a turn that ended without its last update: 499 when the client hung
    up; 503 when a model switch (the new model loads) or a shutdown stopped it."""
    if gone.done():
        return Response(status_code=499)
    return error_response(503, STOPPED_BY_SERVER, type_="server_error",
                          code="stopped", headers={"Retry-After": str(RETRY_LOADING_S)})


def turn_refusal(exc: ApiError | ChatError | ChatNotFound, prompt_param: str) -> JSONResponse:
    """A request refused before its answer began, in OpenAI's shape and with the status a
    client expects; prompt_param: the field that holds the prompt (too long for the context)."""
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, ChatNotFound):
        return error_response(404, str(exc), param=CHAT_HEADER, code="chat_not_found")
    if isinstance(exc, MessageTooLong):  # OpenAI's status and code for it (its SDK's too)
        return error_response(400, str(exc), param=prompt_param,
                              code="context_length_exceeded")
    if isinstance(exc, ServerBusy):  # every slot busy and the line full: nothing was stored
        return error_response(429, str(exc), type_="server_error", code="server_full",
                              headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, NoModel):
        return error_response(503, str(exc), type_="server_error", code="no_model",
                              headers={"Retry-After": str(RETRY_NO_MODEL_S)})
    # EmptyMessage and other ChatErrors; one that names the request's field says so
    return error_response(400, str(exc), param=getattr(exc, "param", None))


async def client_gone(request: Request) -> None:
    """Return once the client has hung up (the ASGI server says http.disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_json(request: Request) -> Any:
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
        if len(raw) > MAX_V1_BODY_BYTES:
            raise ApiError(413, f"the request body is over {MAX_V1_BODY_BYTES:,} bytes",
                           code="request_too_large")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None


def usage_of(done: TurnUpdate) -> dict:
    s = done.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated,
            # how much of the prompt was not recomputed, and from where (not in OpenAI's API)
            "prompt_tokens_details": {"cached_tokens": s.reused}}


def usage_of_all(dones: list[TurnUpdate]) -> dict:
    """One prompt, every choice's tokens (as OpenAI counts n choices)."""
    total = usage_of(dones[0])
    generated = sum(d.stats.generated for d in dones)
    return {**total, "completion_tokens": generated,
            "total_tokens": total["prompt_tokens"] + generated}


def figures_of(done: TurnUpdate) -> dict:
    s = done.stats
    return {"reused": s.reused, "source": s.source, "prefilled": s.prefilled,
            "first_token_s": round(s.first_token_s, 4), "chat_id": done.chat_id,
            "first_logits": s.first_logits}


def sse_error(message: str, code: str | None) -> str:
    return "data: " + json.dumps({"error": {"message": message, "type": "server_error",
                                            "param": None, "code": code}}) + "\n\n"
