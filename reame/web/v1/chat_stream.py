"""POST /v1/chat/completions streamed: the reply as server-sent events, chunk by chunk, each
choice's role, content, tool calls and end; with n > 1 the other choices after the first, their
chunks interleaved. An end the server made (a model switch, a shutdown) or a failure after the
answer began is said in the stream, then [DONE]."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from reame.chats.service import ChatError, TurnUpdate
from reame.inference.turn_stream import TurnStream
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.chat_request import CompletionRequest
from reame.web.v1.common import (
    INTERNAL_ERROR,
    STOPPED_BY_SERVER,
    figures_of,
    sse_error,
    started,
    usage_of_all,
)
from reame.web.v1.reply_shape import ReplyShape, logprob_entries

log = logging.getLogger(__name__)


async def chat_events(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future,
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
                yield f"data: {json.dumps(body([], usage=usage_of_all(dones)))}\n\n"
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

    shape = ReplyShape(parsed.calls_tools, parsed.call_id_prefix)
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
