"""OpenAI-compatible endpoints on the app's own server: GET /v1/models, POST /v1/chat/completions
(and POST /v1/completions, completions.py).

Stateless clients resend the whole conversation each time; the KV cache finds it anyway (the
request's tokens are looked up by chained block hashes among the KV files, tokens checked), so
the second request of a conversation evaluates only its new tokens. A request with the header
`X-Reame-Chat: <chat id>` is instead a turn of that stored chat: its last user message is added
to the chat (which keeps its own history and settings) and the exchange shows in the page.

Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the status a
client expects: 400 bad request (a conversation too long for the context: context_length_exceeded,
as OpenAI says it), 401 no or wrong key, 404 unknown model or chat, 413 a body too large,
429 when every slot is busy and the line of waiting turns is full (with Retry-After), 503
while a model loads or when none is loaded (with Retry-After).

A client that hangs up stops its turn at once, streamed or not, also while its prompt is being
evaluated or it waits in line: every wait for the next update races the connection's end
(http.disconnect). A client that stops reading, its connection open, is the scheduler's
stall bound's ([server] stalled_reply_s): its turn is stopped then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from reame.accounts.live import LiveAccounts
from reame.chats.service import (
    ChatError,
    ChatNotFound,
    ChatService,
    TurnUpdate,
)
from reame.inference.held import GrammarError
from reame.inference.turn_stream import TurnStream
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.chat_request import ApiError, CompletionRequest, parse_request
from reame.web.v1.common import (
    CHAT_HEADER,
    INTERNAL_ERROR,
    STOPPED_BY_SERVER,
    client_gone,
    cut_short,
    ended,
    figures_of,
    last_update,
    read_json,
    refused,
    sse_error,
    started,
    system_fingerprint,
    turn_refusal,
    usage_of,
)
from reame.web.v1.completions import add_completions
from reame.web.v1.reply_shape import ReplyShape

log = logging.getLogger(__name__)


def build_router(service: ChatService, live: LiveAccounts) -> APIRouter:
    """The /v1 routes. With accounts, every request needs `Authorization: Bearer <key>`."""
    router = APIRouter(prefix="/v1")

    def caller(request: Request) -> str | None:
        accounts = live.current
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
            body = await read_json(request)
        except ApiError as exc:
            return exc.response()
        # From here the request has nothing more to read: the next message is its end.
        gone = asyncio.ensure_future(client_gone(request))
        try:
            ready()
            # A schema's conversion and the grammar's check take milliseconds to a second:
            # off the event loop, which answers every other request meanwhile.
            parsed = await asyncio.to_thread(_parsed, service, body, model_ids())
            chat_id = _chat_header(request)
            _check_choices(service, parsed, chat_id)
            if chat_id is not None:
                service.get_chat(chat_id, user)  # 404 now, not in the middle of a stream
            start = _starter(service, parsed, chat_id, user)
            fingerprint, vocab = system_fingerprint(service), service.engine
            updates = await started(start, gone)
            # Tokenizing and the first update (it waits for a slot, and the prompt): refusals
            # (too long, empty, no model, full) raise here, before any byte is sent.
            first = await updates.next()
        except (ApiError, ChatError, ChatNotFound) as exc:
            return refused(gone, turn_refusal(exc, "messages"))
        except BaseException:
            gone.cancel()
            raise
        if first is None:  # the client hung up: nobody reads an answer
            gone.cancel()
            return Response(status_code=499)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        # Choices after the first start once it has ended: its KV file holds their prompt.
        more = [_starter(service, parsed, None, user, k) for k in range(1, parsed.n)]
        if parsed.stream:
            return StreamingResponse(_sse(updates, first, gone, completion_id, parsed,
                                          fingerprint, vocab, more),
                                     media_type="text/event-stream",
                                     # nginx passes each event on as it comes
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        if more:
            return await _many(updates, first, gone, more, completion_id, parsed,
                               fingerprint, vocab)
        done = await last_update(updates, first, gone, "messages")
        if not isinstance(done, TurnUpdate):
            return done  # the client hung up, or the server stopped the turn
        return _whole([done], completion_id, parsed, fingerprint, vocab)

    add_completions(router, service, caller, ready, model_ids)
    return router


def _parsed(service: ChatService, body: object, models: list[str]) -> CompletionRequest:
    parsed = parse_request(body, models)
    _check_grammar(service, parsed)
    return parsed


def _check_grammar(service: ChatService, parsed: CompletionRequest) -> None:
    """A grammar from a client's schema that llama.cpp cannot follow, or too big to follow
    cheaply, is a 400 naming where it came from (never a failed turn)."""
    engine = service.engine
    if parsed.grammar is None or engine is None:
        return
    try:
        engine.check_grammar(parsed.grammar, parsed.grammar_trigger)
    except GrammarError as exc:
        param = "tools" if parsed.tools else "response_format"
        raise ApiError(400, f"'{param}' cannot be followed: {exc}", param=param) from None


def _chat_header(request: Request) -> int | None:
    value = request.headers.get(CHAT_HEADER)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ApiError(400, f"{CHAT_HEADER} must be a chat id (a number)", param=CHAT_HEADER)
    return int(value)


def _starter(service: ChatService, parsed: CompletionRequest, chat_id: int | None,
             user: str | None, choice: int = 0) -> Callable[[], TurnStream]:
    """How to start the turn of one choice; choice k > 0 samples with seed + k (each its own
    reply, reproducible with a seed)."""
    seed = parsed.seed + choice if parsed.seed is not None and choice else parsed.seed
    if chat_id is not None:
        # A stored chat samples with its own settings: what would change that is refused.
        asked = {"logit_bias": bool(parsed.logit_bias),
                 "frequency_penalty": parsed.frequency_penalty != 0,
                 "presence_penalty": parsed.presence_penalty != 0,
                 "logprobs": parsed.top_logprobs is not None,
                 "response_format": parsed.grammar is not None and not parsed.tools,
                 "tools": bool(parsed.tools)}
        if parsed.turns[-1].role != "user":
            raise ApiError(400, f"with {CHAT_HEADER} the last message is the user's: it is "
                           "added to the stored chat", param="messages")
        refused = next((param for param, wanted in asked.items() if wanted), None)
        if refused is not None:
            raise ApiError(400, f"{refused} is for requests without {CHAT_HEADER}: a stored "
                           "chat's replies are sampled with the chat's settings", param=refused)
        return lambda: service.send(
            chat_id, parsed.turns[-1].content, user=user, seed=seed,
            max_tokens=parsed.max_tokens, stop=parsed.stop)
    return lambda: service.complete(
        parsed.system_prompt, parsed.turns, max_tokens=parsed.max_tokens,
        temperature=parsed.temperature, top_p=parsed.top_p, seed=seed, stop=parsed.stop,
        logit_bias=parsed.logit_bias, frequency_penalty=parsed.frequency_penalty,
        presence_penalty=parsed.presence_penalty, top_logprobs=parsed.top_logprobs,
        grammar=parsed.grammar, grammar_trigger=parsed.grammar_trigger, tools=parsed.tools,
        user=user)


def logprob_entries(choices, vocab) -> list[dict]:
    """OpenAI's logprobs.content: per token its text, log-probability, UTF-8 bytes and the
    most likely tokens there."""
    def entry(token: int, logprob: float) -> dict:
        piece = vocab.token_piece(token, special=True)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}

    return [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, p) for t, p in c.top]}
            for c in choices]


def _check_choices(service: ChatService, parsed: CompletionRequest,
                   chat_id: int | None) -> None:
    if parsed.n == 1:
        return
    if chat_id is not None:
        raise ApiError(400, f"'n' above 1 is for requests without {CHAT_HEADER}: a stored "
                       "chat keeps one reply per turn", param="n")
    slots = len(service.engine.sequences)
    if parsed.n > slots:
        raise ApiError(400, f"'n' is at most {slots} here: each choice is written in a slot "
                       f"of its own, and this server has {slots}", param="n")


def _choice_json(index: int, done: TurnUpdate, parsed: CompletionRequest, vocab) -> dict:
    message, finish_reason = ReplyShape(parsed.calls_tools).message(done.text,
                                                                    done.finish_reason)
    return {"index": index, "message": message, "finish_reason": finish_reason,
            "logprobs": (None if done.logprobs is None else
                         {"content": logprob_entries(done.logprobs, vocab), "refusal": None})}


def _usage_of_all(dones: list[TurnUpdate]) -> dict:
    """One prompt, every choice's tokens (as OpenAI counts n choices)."""
    total = usage_of(dones[0])
    generated = sum(d.stats.generated for d in dones)
    return {**total, "completion_tokens": generated,
            "total_tokens": total["prompt_tokens"] + generated}


def _whole(dones: list[TurnUpdate], completion_id: str, parsed: CompletionRequest,
           fingerprint: str, vocab) -> JSONResponse:
    figures = figures_of(dones[0])
    if len(dones) > 1:
        figures["choices"] = [figures_of(d) for d in dones]
    return JSONResponse({
        "id": completion_id, "object": "chat.completion", "created": int(time.time()),
        "model": parsed.model, "system_fingerprint": fingerprint,
        "choices": [_choice_json(n, d, parsed, vocab) for n, d in enumerate(dones)],
        "usage": _usage_of_all(dones), "reame": figures,
    })


async def _many(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
                more: list[Callable[[], TurnStream]], completion_id: str,
                parsed: CompletionRequest, fingerprint: str, vocab) -> Response:
    """n choices answered whole: the first, then the others together, each in its own slot
    from the first one's prompt KV (found by its tokens, as any resent conversation's)."""
    feeds = [updates]
    try:
        done = await ended(updates, first)
        if done is None:
            return cut_short(gone)
        dones = [done]
        for start in more:
            feeds.append(await started(start, gone))
        ends = await asyncio.gather(*(ended(feed, None) for feed in feeds[1:]))
        if any(end is None for end in ends):
            return cut_short(gone)
        dones += ends
    except (ApiError, ChatError, ChatNotFound) as exc:  # a later choice refused (a full line)
        return turn_refusal(exc, "messages")
    finally:
        gone.cancel()
        for feed in feeds:
            feed.interrupt()
    return _whole(dones, completion_id, parsed, fingerprint, vocab)


async def _sse(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
               completion_id: str, parsed: CompletionRequest, fingerprint: str, vocab,
               more: list[Callable[[], TurnStream]]) -> AsyncIterator[str]:
    """The turn as server-sent events, from its first update; with n > 1, the other choices
    after it, together (their chunks interleaved, each with its index). The turns are stopped
    when the client hangs up (gone) or this stream is closed."""
    created = int(time.time())
    feeds, dones = [updates], []

    def body(choices: list[dict], **extra) -> dict:
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                "model": parsed.model, "system_fingerprint": fingerprint, "choices": choices,
                **extra}

    try:
        async for event in _choice_events(0, updates, first, parsed, vocab, body, dones):
            yield event
        if len(dones) == 1 and more:
            for start in more:
                feeds.append(await started(start, gone))
            async for event in _merged([
                    _choice_events(k, feed, None, parsed, vocab, body, dones)
                    for k, feed in enumerate(feeds[1:], start=1)]):
                yield event
        if len(dones) == parsed.n:
            if parsed.include_usage:
                yield f"data: {json.dumps(body([], usage=_usage_of_all(dones)))}\n\n"
        elif gone.done():
            return  # the client hung up: nobody reads the rest
        else:
            # Ended without its last update: stopped on the server's side (a model switch, a
            # shutdown); the client is told rather than left with a reply cut without a word.
            yield sse_error(STOPPED_BY_SERVER, "stopped")
    except ChatError as exc:  # e.g. the chat was deleted while it answered, or a full line
        yield sse_error(str(exc), None)
    except Exception:  # the answer has started: say so in the stream, log the rest
        log.exception("a streamed completion failed")
        yield sse_error(INTERNAL_ERROR, "internal_error")
    finally:
        gone.cancel()
        for feed in feeds:
            feed.interrupt()
    yield "data: [DONE]\n\n"


async def _choice_events(index: int, updates: UpdateFeed, first: TurnUpdate | None,
                         parsed: CompletionRequest, vocab, body: Callable[..., dict],
                         dones: list[TurnUpdate]) -> AsyncIterator[str]:
    """One choice's chunks: its role, its content and calls as they come, its end (its last
    update then goes into dones)."""
    def chunk(delta: dict, finish: str | None = None, *, with_logprobs: bool = True,
              **extra) -> str:
        nonlocal told
        logprobs = None
        if with_logprobs and update.logprobs is not None and len(update.logprobs) > told:
            logprobs = {"content": logprob_entries(update.logprobs[told:], vocab),
                        "refusal": None}
            told = len(update.logprobs)
        return "data: " + json.dumps(body([{"index": index, "delta": delta,
                                            "finish_reason": finish, "logprobs": logprobs}],
                                          **extra)) + "\n\n"

    shape = ReplyShape(parsed.calls_tools)
    update = first if first is not None else await updates.next()
    # sent: the content sent; called: the calls sent; told: the tokens whose logprobs were sent
    sent, called, told = "", 0, 0
    if update is None:
        return
    yield chunk({"role": "assistant", "content": ""}, with_logprobs=False)
    while update is not None:
        content, calls = shape.shown(update.text, update.done)
        if content.startswith(sent) and len(content) > len(sent):
            yield chunk({"content": content[len(sent):]})
            sent = content
        for n in range(called, len(calls)):
            yield chunk({"tool_calls": [{"index": n, **shape.call(n, calls[n])}]})
        called = len(calls)
        if update.done:
            yield chunk({}, shape.finish(update.text, update.finish_reason),
                        reame=figures_of(update))
            dones.append(update)
            return
        update = await updates.next()


async def _merged(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The items of several async iterators as each comes; what one raises is raised."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(stream: AsyncIterator[str]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except BaseException as exc:  # noqa: BLE001 - given to the consumer
            await queue.put(exc)
        finally:
            await queue.put(end)

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is end:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


