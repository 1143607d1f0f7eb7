"""POST /v1/completions: OpenAI's legacy text completions, text in, text out, streamed or not.

The prompt is the client's own text (completion clients write their own template): tokenized
with its control tokens parsed and a BOS where the model wants one, as llama-server does; no
chat template. Its KV is found by its tokens like a stateless conversation's (the cache's
chained block hashes), so a client that resends its text grown by the completion and more
evaluates only what is new. Everything else is /v1/chat/completions' (chat_completions.py): the key,
the JSON-only body and its size, the refusals (429, 503, OpenAI's error shape), a client that
hangs up stopping its turn.
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

from reame.chats.service import ChatError, ChatService, TurnUpdate
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.common import (
    INTERNAL_ERROR,
    STOPPED_BY_SERVER,
    figures_of,
    last_update,
    open_turn,
    sse_error,
    system_fingerprint,
    usage_of,
)
from reame.web.v1.completions_request import TextRequest, parse_completions

log = logging.getLogger(__name__)


def add_completions(router: APIRouter, service: ChatService,
                    caller: Callable[[Request], str | None], ready: Callable[[], None],
                    model_ids: Callable[[], list[str]]) -> None:
    """Add POST /completions to the /v1 router, with its key check (caller), its readiness
    check (ready) and its models."""

    @router.post("/completions")
    async def completions(request: Request):
        async def prepare(user, body):
            parsed = parse_completions(body, model_ids())
            start = lambda: service.complete_text(  # noqa: E731
                parsed.prompt, max_tokens=parsed.max_tokens, temperature=parsed.temperature,
                top_p=parsed.top_p, seed=parsed.seed, stop=parsed.stop,
                logit_bias=parsed.logit_bias, frequency_penalty=parsed.frequency_penalty,
                presence_penalty=parsed.presence_penalty, top_logprobs=parsed.logprobs,
                user=user)
            return start, (parsed, system_fingerprint(service), service.engine)

        opened = await open_turn(request, caller, ready, prepare, "prompt")
        if isinstance(opened, Response):
            return opened
        updates, first, gone = opened.updates, opened.first, opened.gone
        parsed, fingerprint, vocab = opened.context
        answer = Answer(f"cmpl-{uuid.uuid4().hex}", parsed, fingerprint, vocab)
        if parsed.stream:
            return StreamingResponse(_sse(updates, first, gone, answer),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        done = await last_update(updates, first, gone, "prompt")
        if not isinstance(done, TurnUpdate):
            return done  # the client hung up, or the server stopped the turn
        return JSONResponse(answer.whole(done))


class Answer:
    """A completion's response in OpenAI's shapes: whole, or as chunks of a stream."""

    def __init__(self, completion_id: str, parsed: TextRequest, fingerprint: str, vocab):
        self.id, self.parsed, self.fingerprint, self.vocab = (
            completion_id, parsed, fingerprint, vocab)
        self.created = int(time.time())
        prompt = parsed.prompt
        self.echo = "" if not parsed.echo else (
            prompt if isinstance(prompt, str) else vocab.detokenize(prompt, special=True))
        self.told = 0  # tokens whose log-probabilities were sent
        self.offset = len(self.echo)  # where the next token's text begins in the text sent

    def body(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.parsed.model, "system_fingerprint": self.fingerprint,
                "choices": choices, **extra}

    def whole(self, done: TurnUpdate) -> dict:
        return self.body([{"text": self.echo + done.text, "index": 0,
                           "logprobs": self.logprobs(done, len(self.echo) + len(done.text)),
                           "finish_reason": done.finish_reason}],
                         usage=usage_of(done), reame=figures_of(done))

    def chunk(self, text: str, update: TurnUpdate | None, finish: str | None = None,
              **extra) -> str:
        logprobs = None
        if update is not None:
            logprobs = self.logprobs(update, len(self.echo) + len(update.text))
            logprobs = logprobs if logprobs and logprobs["tokens"] else None
        body = self.body([{"text": text, "index": 0, "logprobs": logprobs,
                           "finish_reason": finish}], **extra)
        return f"data: {json.dumps(body)}\n\n"

    def logprobs(self, update: TurnUpdate, end: int) -> dict | None:
        """OpenAI's legacy logprobs of the tokens not told yet, up to end (the length of the
        text so far: a token past a stop string is not in it): each token's text, its
        log-probability, the likeliest tokens there with the sampled one, and where its text
        begins in the response's text."""
        if update.logprobs is None:
            return None
        piece = self.vocab.token_text
        tokens, logprobs, tops, offsets = [], [], [], []
        for choice in update.logprobs[self.told:]:
            if self.offset >= end and update.done:
                break  # cut at a stop string, or past the text
            text = piece(choice.token)
            tokens.append(text)
            logprobs.append(choice.logprob)
            top = {piece(t): p for t, p in choice.top}
            top.setdefault(text, choice.logprob)  # OpenAI: up to logprobs + 1 of them
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
            self.told += 1
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
                "text_offset": offsets}


async def _sse(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
               answer: Answer) -> AsyncIterator[str]:
    """The completion as server-sent events, from its first update; the turn is stopped when
    the client hangs up (gone) or this stream is closed."""
    sent, update = "", first
    try:
        if answer.echo:
            yield answer.chunk(answer.echo, None)
        while update is not None:
            text = update.text
            if text.startswith(sent) and len(text) > len(sent):
                yield answer.chunk(text[len(sent):], update)
                sent = text
            if update.done:
                yield answer.chunk("", update, update.finish_reason, reame=figures_of(update))
                if answer.parsed.include_usage:
                    yield f"data: {json.dumps(answer.body([], usage=usage_of(update)))}\n\n"
                break
            update = await updates.next()
        else:
            if gone.done():
                return  # the client hung up: nobody reads the rest
            # Ended without its last update: stopped on the server's side (a model switch, a
            # shutdown); the client is told rather than left with a text cut without a word.
            yield sse_error(STOPPED_BY_SERVER, "stopped")
    except ChatError as exc:
        yield sse_error(str(exc), None)
    except Exception:  # the answer has started: say so in the stream, log the rest
        log.exception("a streamed text completion failed")
        yield sse_error(INTERNAL_ERROR, "internal_error")
    finally:
        gone.cancel()
        updates.interrupt()
    yield "data: [DONE]\n\n"
