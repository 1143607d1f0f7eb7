"""POST /v1/messages (Anthropic's Messages API, what the `anthropic` SDK and Claude Code send)
and POST /v1/messages/count_tokens, on the same stateless turns as chat completions: the KV is
found by the prompt's tokens, so an agent resending its long prompt each step evaluates only
what is new (usage.cache_read_input_tokens says how much was reused). Streamed with Anthropic's
events (message_start, content_block_start/delta/stop, message_delta, message_stop). Errors have
Anthropic's shape, {"type": "error", "error": {"type", "message"}}. The body is read by
messages_request.py."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from reame.chats.service import ChatError, ChatService, TurnUpdate
from reame.inference.scope import user_scope
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.common import (
    INTERNAL_ERROR,
    STOPPED_BY_SERVER,
    last_update,
    open_turn,
    read_json,
    turn_refusal,
)
from reame.web.v1.errors import ApiError
from reame.web.v1.messages_request import (
    WRITTEN,
    CountRequest,
    MessagesRequest,
    parse_body,
    read_turn,
    sampling_of,
)
from reame.web.v1.reply_shape import ReplyShape

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               415: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


def anthropic_error(response: Response) -> Response:
    """An error response of /v1 (OpenAI's shape) in Anthropic's, same status and headers."""
    if not isinstance(response, JSONResponse):
        return response  # 499: nobody reads it
    message = json.loads(response.body)["error"]["message"]
    headers = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
    return JSONResponse({"type": "error", "error": {
        "type": ERROR_TYPES.get(response.status_code, "api_error"), "message": message}},
        status_code=response.status_code, headers=headers)


def add_messages(router: APIRouter, service: ChatService,
                 caller: Callable[[Request], str | None], ready: Callable[[], None]) -> None:
    """Add POST /messages and /messages/count_tokens to the /v1 router."""

    @router.post("/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            user = caller(request)
            ready()
            body = parse_body(CountRequest, await read_json(request))
            turn = await asyncio.to_thread(read_turn, body)
            count = await run_in_threadpool(_count, service, turn, user)
        except (ApiError, ChatError) as exc:
            return anthropic_error(turn_refusal(exc, "messages"))
        return {"input_tokens": count}

    @router.post("/messages")
    async def messages(request: Request):
        async def prepare(user, body):
            parsed = parse_body(MessagesRequest, body)
            turn = await asyncio.to_thread(read_turn, parsed)
            start = lambda: service.complete(  # noqa: E731
                turn.system_prompt, turn.turns, max_tokens=parsed.max_tokens,
                grammar=turn.grammar, grammar_trigger=turn.trigger, tools=turn.tools,
                user=user, **sampling_of(parsed))
            return start, (parsed, turn, service.engine.name)

        opened = await open_turn(request, caller, ready, prepare, "messages")
        if isinstance(opened, Response):
            return anthropic_error(opened)
        updates, first, gone = opened.updates, opened.first, opened.gone
        parsed, turn, model = opened.context
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        shape = ReplyShape(turn.calls_tools)
        stops = tuple(parsed.stop_sequences or ())
        if parsed.stream:
            return StreamingResponse(
                _events(updates, first, gone, message_id, model, shape, stops),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        done = await last_update(updates, first, gone, "messages")
        if not isinstance(done, TurnUpdate):
            return anthropic_error(done)
        content, calls = shape.parts(done.text)
        blocks = ([{"type": "text", "text": content}] if content else []) + [
            _tool_use(shape, n, call) for n, call in enumerate(calls)]
        return {"id": message_id, "type": "message", "role": "assistant", "model": model,
                "content": blocks, "stop_reason": _stop_reason(done, calls, stops),
                "stop_sequence": _stop_sequence(done, stops), "usage": usage_of(done)}


def _count(service: ChatService, turn, user: str | None) -> int:
    with service.using_model() as runtime:
        _, prompt = service.replies.tokenize(runtime.prompts, turn.system_prompt, turn.turns,
                                             user_scope(user), turn.tools)
    return len(prompt)


def usage_of(done: TurnUpdate) -> dict:
    """Anthropic's usage: input_tokens are those evaluated, cache_read_input_tokens those whose
    KV was reused (their sum is the prompt)."""
    s = done.stats
    return {"input_tokens": s.prompt_tokens - s.reused, "output_tokens": s.generated,
            "cache_read_input_tokens": s.reused, "cache_creation_input_tokens": 0}


def _tool_use(shape: ReplyShape, n: int, call) -> dict:
    call_id = shape.call(n, call)["id"].replace("call_", "toolu_")
    WRITTEN.remember(call_id, call.arguments)
    return {"type": "tool_use", "id": call_id, "name": call.name,
            "input": json.loads(call.arguments)}


def _stop_sequence(done: TurnUpdate, stops: tuple[str, ...]) -> str | None:
    """The request's stop sequence the reply ended at (not the chat template's end)."""
    return done.stop_sequence if done.stop_sequence in stops else None


def _stop_reason(done: TurnUpdate, calls: list, stops: tuple[str, ...]) -> str:
    if done.finish_reason == "length":
        return "max_tokens"
    if calls:
        return "tool_use"
    return "stop_sequence" if _stop_sequence(done, stops) else "end_turn"


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


async def _events(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
                  message_id: str, model: str, shape: ReplyShape,
                  stops: tuple[str, ...]) -> AsyncIterator[str]:
    """The turn as Anthropic's server-sent events: a text block as the words come, each tool
    call a tool_use block once it is whole (its input in one input_json_delta)."""
    blocks, sent, called, text_open = 0, "", 0, False
    try:
        yield _event("message_start", {"message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            # The prompt's tokens not read from the cache, as far as known now (a turn still
            # waiting in line: all of them); message_delta's usage has the final counts.
            "usage": {"input_tokens": first.prompt_tokens - first.reused,
                      "cache_read_input_tokens": first.reused,
                      "cache_creation_input_tokens": 0, "output_tokens": 0}}})
        update = first
        while update is not None:
            content, calls = shape.shown(update.text, update.done)
            if content.startswith(sent) and len(content) > len(sent):
                if not text_open:
                    yield _event("content_block_start", {"index": blocks, "content_block": {
                        "type": "text", "text": ""}})
                    text_open = True
                yield _event("content_block_delta", {"index": blocks, "delta": {
                    "type": "text_delta", "text": content[len(sent):]}})
                sent = content
            for n in range(called, len(calls)):
                if text_open:
                    yield _event("content_block_stop", {"index": blocks})
                    blocks, text_open = blocks + 1, False
                block = _tool_use(shape, n, calls[n])
                yield _event("content_block_start", {"index": blocks, "content_block": {
                    **block, "input": {}}})
                yield _event("content_block_delta", {"index": blocks, "delta": {
                    "type": "input_json_delta", "partial_json": calls[n].arguments}})
                yield _event("content_block_stop", {"index": blocks})
                blocks += 1
            called = len(calls)
            if update.done:
                if text_open:
                    yield _event("content_block_stop", {"index": blocks})
                yield _event("message_delta", {
                    "delta": {"stop_reason": _stop_reason(update, calls, stops),
                              "stop_sequence": _stop_sequence(update, stops)},
                    "usage": usage_of(update)})
                yield _event("message_stop", {})
                return
            update = await updates.next()
        if not gone.done():
            yield _error(STOPPED_BY_SERVER, "overloaded_error")
    except ChatError as exc:
        yield _error(str(exc), "invalid_request_error")
    except Exception:
        log.exception("a streamed message failed")
        yield _error(INTERNAL_ERROR, "api_error")
    finally:
        gone.cancel()
        updates.interrupt()


def _error(message: str, kind: str) -> str:
    return "event: error\ndata: " + json.dumps({"type": "error", "error": {
        "type": kind, "message": message}}) + "\n\n"
