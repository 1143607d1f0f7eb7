"""POST /v1/responses streamed: OpenAI's Responses events, each with its sequence_number:
response.created and response.in_progress, then the reply's message item (output_item.added,
content_part.added, output_text.delta as the words come, output_text.done, content_part.done,
output_item.done) and each function call once whole (output_item.added, its
function_call_arguments.delta and .done, output_item.done), then response.completed (or
response.incomplete when max_output_tokens cut it). The response is stored before its last
event (keep)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from reame.chats.service import ChatError, TurnUpdate
from reame.web.http.turn_updates import UpdateFeed
from reame.web.v1.common import INTERNAL_ERROR, STOPPED_BY_SERVER

log = logging.getLogger(__name__)


async def response_events(updates: UpdateFeed, first: TurnUpdate, gone: asyncio.Future, made,
                          keep: Callable[[TurnUpdate, dict], Awaitable[None]]
                          ) -> AsyncIterator[str]:
    sequence = 0

    def event(kind: str, **data) -> str:
        nonlocal sequence
        sequence += 1
        return (f"event: {kind}\ndata: "
                f"{json.dumps({'type': kind, 'sequence_number': sequence - 1, **data})}\n\n")

    sent, called, index, message_open = "", 0, 0, False

    def close_message() -> list[str]:
        nonlocal index, message_open
        if not message_open:
            return []
        part = {"type": "output_text", "text": sent, "annotations": [], "logprobs": []}
        where = {"item_id": made.message_id, "output_index": index, "content_index": 0}
        message_open = False
        index += 1
        return [event("response.output_text.done", **where, text=sent, logprobs=[]),
                event("response.content_part.done", **where, part=part),
                event("response.output_item.done", output_index=index - 1,
                      item=made.message_item(sent))]

    try:
        yield event("response.created", response=made.response(None, "in_progress"))
        yield event("response.in_progress", response=made.response(None, "in_progress"))
        update = first
        while update is not None:
            content, calls = made.shape.shown(update.text, update.done)
            if content.startswith(sent) and len(content) > len(sent) and not called:
                if not message_open:
                    message_open = True
                    yield event("response.output_item.added", output_index=index,
                                item={**made.message_item("", "in_progress"), "content": []})
                    yield event("response.content_part.added", item_id=made.message_id,
                                output_index=index, content_index=0, part={
                                    "type": "output_text", "text": "", "annotations": [],
                                    "logprobs": []})
                yield event("response.output_text.delta", item_id=made.message_id,
                            output_index=index, content_index=0, delta=content[len(sent):],
                            logprobs=[])
                sent = content
            for n in range(called, len(calls)):
                for closing in close_message():
                    yield closing
                item = made.call_item(n, calls[n])
                yield event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=item["arguments"])
                yield event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=index, name=item["name"],
                            arguments=item["arguments"])
                yield event("response.output_item.done", output_index=index, item=item)
                index += 1
            called = len(calls)
            if update.done:
                if not sent and not calls and not message_open:  # an empty reply: its item
                    message_open = True
                    yield event("response.output_item.added", output_index=index,
                                item={**made.message_item("", "in_progress"), "content": []})
                for closing in close_message():
                    yield closing
                response = made.response(update)
                await keep(update, response)
                kind = ("response.incomplete" if response["status"] == "incomplete"
                        else "response.completed")
                yield event(kind, response=response)
                return
            update = await updates.next()
        if not gone.done():
            yield event("error", code="stopped", message=STOPPED_BY_SERVER, param=None)
    except ChatError as exc:
        yield event("error", code=None, message=str(exc), param=None)
    except Exception:
        log.exception("a streamed response failed")
        yield event("error", code="internal_error", message=INTERNAL_ERROR, param=None)
    finally:
        gone.cancel()
        updates.interrupt()
