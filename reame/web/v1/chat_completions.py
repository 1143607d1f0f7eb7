"""POST /v1/chat/completions: a conversation in, the assistant's reply out (whole, or streamed:
chat_stream.py), with tools, a response format and n choices.

Stateless clients resend the whole conversation each time; the KV cache finds it anyway (the
request's tokens are looked up by chained block hashes among the KV files, tokens checked), so
the second request of a conversation evaluates only its new tokens. A request with the header
`X-Reame-Chat: <chat id>` is instead a turn of that stored chat: its last user message (or the
tool results it ends with) is added to the chat (which keeps its own history and settings), a
reply's tool calls are kept with it, and the exchange shows in the page.
Everything every /v1 route does alike (the key, the errors' shape, a client that hangs up) is
router.py's and common.py's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from reame.chats.service import (
    ChatError,
    ChatNotFound,
    ChatService,
    TurnUpdate,
)
from reame.chats.tool_calls import ToolOffer
from reame.inference.held import GrammarError
from reame.inference.turn_stream import TurnStream
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.chat_request import CompletionRequest, parse_request
from reame.web.v1.chat_stream import chat_events
from reame.web.v1.common import (
    CHAT_HEADER,
    cut_short,
    ended,
    figures_of,
    last_update,
    open_turn,
    started,
    system_fingerprint,
    turn_refusal,
    usage_of_all,
)
from reame.web.v1.errors import ApiError
from reame.web.v1.parameters import llama_seed
from reame.web.v1.reply_shape import ReplyShape, logprob_entries


def add_chat_completions(router: APIRouter, service: ChatService,
                         caller: Callable[[Request], str | None], ready: Callable[[], None],
                         model_ids: Callable[[], list[str]]) -> None:
    """Add POST /chat/completions to the /v1 router, with its key check (caller), its
    readiness check (ready) and its models."""

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        async def prepare(user, body):
            # A schema's conversion and the grammar's check take milliseconds to a second:
            # off the event loop, which answers every other request meanwhile.
            chat_id = _chat_header(request)
            parsed = await asyncio.to_thread(_parsed, service, body, model_ids(),
                                             chat_id is not None)
            if chat_id is not None and parsed.tools:  # its calls' ids, as the chat keeps them
                parsed = replace(parsed, call_id_prefix=f"call_{uuid.uuid4().hex[:20]}_")
            _check_choices(service, parsed, chat_id)
            if chat_id is not None:
                service.get_chat(chat_id, user)  # 404 now, not in the middle of a stream
            return (_starter(service, parsed, chat_id, user),
                    (parsed, system_fingerprint(service), service.engine))

        opened = await open_turn(request, caller, ready, prepare, "messages")
        if isinstance(opened, Response):
            return opened
        updates, first, gone = opened.updates, opened.first, opened.gone
        parsed, fingerprint, vocab = opened.context
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        # Choices after the first start once it has ended: its KV file holds their prompt.
        more = [_starter(service, parsed, None, opened.user, k) for k in range(1, parsed.n)]
        if parsed.stream:
            return StreamingResponse(chat_events(updates, first, gone, completion_id, parsed,
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


def _parsed(service: ChatService, body: object, models: list[str],
            stored: bool) -> CompletionRequest:
    parsed = parse_request(body, models, stored)
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
    seed = llama_seed(parsed.seed + choice) if parsed.seed is not None and choice else parsed.seed
    if chat_id is not None:
        # A stored chat samples with its own settings: what would change that is refused.
        asked = {"logit_bias": bool(parsed.logit_bias),
                 "frequency_penalty": parsed.frequency_penalty != 0,
                 "presence_penalty": parsed.presence_penalty != 0,
                 "logprobs": parsed.top_logprobs is not None,
                 "response_format": parsed.formatted}
        if not parsed.turns or parsed.turns[-1].role not in ("user", "tool"):
            raise ApiError(400, f"with {CHAT_HEADER} the last message is the user's, or the "
                           "results of the tools the chat's last reply called: it is added to "
                           "the stored chat", param="messages")
        refused = next((param for param, wanted in asked.items() if wanted), None)
        if refused is not None:
            raise ApiError(400, f"{refused} is for requests without {CHAT_HEADER}: a stored "
                           "chat's replies are sampled with the chat's settings", param=refused)
        offer = (ToolOffer(parsed.tools, parsed.grammar, parsed.grammar_trigger,
                           parsed.call_id_prefix or "") if parsed.tools else None)
        if parsed.results:
            return lambda: service.send_results(
                chat_id, list(parsed.results), user=user, seed=seed,
                max_tokens=parsed.max_tokens, stop=parsed.stop, offer=offer)
        return lambda: service.send(
            chat_id, parsed.turns[-1].content, user=user, seed=seed,
            max_tokens=parsed.max_tokens, stop=parsed.stop, offer=offer)
    return lambda: service.complete(
        parsed.system_prompt, parsed.turns, max_tokens=parsed.max_tokens,
        temperature=parsed.temperature, top_p=parsed.top_p, seed=seed, stop=parsed.stop,
        logit_bias=parsed.logit_bias, frequency_penalty=parsed.frequency_penalty,
        presence_penalty=parsed.presence_penalty, top_logprobs=parsed.top_logprobs,
        grammar=parsed.grammar, grammar_trigger=parsed.grammar_trigger, tools=parsed.tools,
        user=user)


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
    message, finish_reason = ReplyShape(parsed.calls_tools, parsed.call_id_prefix).message(
        done.text, done.finish_reason)
    return {"index": index, "message": message, "finish_reason": finish_reason,
            "logprobs": (None if done.logprobs is None else
                         {"content": logprob_entries(done.logprobs, vocab), "refusal": None})}


def _whole(dones: list[TurnUpdate], completion_id: str, parsed: CompletionRequest,
           fingerprint: str, vocab) -> JSONResponse:
    figures = figures_of(dones[0])
    if len(dones) > 1:
        figures["choices"] = [figures_of(d) for d in dones]
    return JSONResponse({
        "id": completion_id, "object": "chat.completion", "created": int(time.time()),
        "model": parsed.model, "system_fingerprint": fingerprint,
        "choices": [_choice_json(n, d, parsed, vocab) for n, d in enumerate(dones)],
        "usage": usage_of_all(dones), "reame": figures,
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
