"""POST /v1/responses (OpenAI's Responses API, the OpenAI Agents SDK's default), GET and DELETE
/v1/responses/{id} and GET /v1/responses/{id}/input_items, on the same stateless turns as chat completions.

A response is stored (unless `store: false`) with its new input items and its reply as the
model wrote it, its user's (stored_responses.py: bounded per user, expiring). A request with
`previous_response_id` sends only its new input: the chain's items are read back from the
database, and the prompt they make is found in the KV cache by its tokens (the reply's own
tokens spliced in), so only the new input is evaluated, also after a restart. The body is read
by responses_request.py; streamed, the events are responses_stream.py's."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from reame.chats.service import (
    ChatService,
    ResponseNotFound,
    StoredResponses,
    TurnUpdate,
)
from reame.web.v1.common import last_update, open_turn
from reame.web.v1.errors import ApiError, check_model
from reame.web.v1.reply_shape import ReplyShape
from reame.web.v1.responses_request import ResponsesRequest, new_items, parse, read_turn
from reame.web.v1.responses_stream import response_events


def add_responses(router: APIRouter, service: ChatService,
                  caller: Callable[[Request], str | None], ready: Callable[[], None],
                  model_ids: Callable[[], list[str]]) -> None:
    """Add POST /responses, GET and DELETE /responses/{id} to the /v1 router."""
    stored = service.stored_responses()

    @router.get("/responses/{response_id}")
    async def get_response(request: Request, response_id: str):
        try:
            user = caller(request)
            _, data = await run_in_threadpool(_found, stored, response_id, user)
        except ApiError as exc:
            return exc.response()
        return data["response"]

    @router.get("/responses/{response_id}/input_items")
    async def input_items(request: Request, response_id: str, order: str = "desc"):
        try:
            user = caller(request)
            if order not in ("asc", "desc"):
                raise ApiError(400, "'order' must be asc or desc", param="order")
            _, data = await run_in_threadpool(_found, stored, response_id, user)
        except ApiError as exc:
            return exc.response()
        items = [_listed(response_id, n, item) for n, item in enumerate(data["input"])]
        items = items[::-1] if order == "desc" else items
        return {"object": "list", "data": items, "has_more": False,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None}

    @router.delete("/responses/{response_id}")
    async def delete_response(request: Request, response_id: str):
        try:
            user = caller(request)
            await run_in_threadpool(_found, stored, response_id, user, True)
        except ApiError as exc:
            return exc.response()
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @router.post("/responses")
    async def create_response(request: Request):
        async def prepare(user, body):
            parsed = await asyncio.to_thread(parse, body)
            check_model(parsed.model, model_ids())
            chain = []
            if parsed.previous_response_id is not None:
                chain = await run_in_threadpool(_chain, stored, parsed.previous_response_id,
                                                user)
            items = new_items(parsed)
            turn = await asyncio.to_thread(read_turn, parsed, chain, items)
            start = lambda: service.complete(  # noqa: E731
                turn.system_prompt, turn.turns, max_tokens=parsed.max_output_tokens,
                grammar=turn.grammar, grammar_trigger=turn.trigger, tools=turn.tools,
                user=user, **({} if parsed.temperature is None
                              else {"temperature": parsed.temperature}),
                **({} if parsed.top_p is None else {"top_p": parsed.top_p}))
            return start, (parsed, items, turn)

        opened = await open_turn(request, caller, ready, prepare, "input")
        if isinstance(opened, Response):
            return opened
        user, updates, first, gone = opened.user, opened.updates, opened.first, opened.gone
        parsed, items, turn = opened.context
        shape = ReplyShape(turn.calls_tools)
        made = Made(f"resp_{uuid.uuid4().hex}", int(time.time()), parsed, shape)

        async def keep(done: TurnUpdate, response: dict) -> None:
            if parsed.store is not False:
                await run_in_threadpool(stored.save, made.id, user, parsed.previous_response_id,
                                        {"input": items, "reply": done.text,
                                         "response": response})

        if parsed.stream:
            return StreamingResponse(response_events(updates, first, gone, made, keep),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        done = await last_update(updates, first, gone, "input")
        if not isinstance(done, TurnUpdate):
            return done
        response = made.response(done)
        await keep(done, response)
        return response


def _listed(response_id: str, n: int, item: dict) -> dict:
    """A stored input item as OpenAI lists it: with an id (its own, or one made from the
    response's and its place) and a message's content as parts."""
    listed = {"id": item.get("id") or f"item_{response_id[5:21]}_{n}", "status": "completed",
              **{k: v for k, v in item.items() if k != "id"}}
    if item.get("type", "message") == "message":
        content = item["content"]
        listed["type"] = "message"
        listed["content"] = ([{"type": "input_text", "text": content}]
                             if isinstance(content, str) else content)
    return listed


def _found(stored: StoredResponses, response_id: str, user: str | None,
           delete: bool = False) -> tuple[str | None, dict]:
    try:
        if delete:
            stored.delete(response_id, user)
            return None, {}
        return stored.get(response_id, user)
    except ResponseNotFound:
        raise ApiError(404, f"No response with id '{response_id}' found (responses are kept "
                       "for their user, a bounded number, for 30 days)", param="response_id",
                       code="not_found") from None


def _chain(stored: StoredResponses, previous: str, user: str | None) -> list[dict]:
    try:
        return stored.chain(previous, user)
    except ResponseNotFound as exc:
        raise ApiError(400, f"Previous response with id '{exc}' not found (responses are kept "
                       "for their user, a bounded number, for 30 days)",
                       param="previous_response_id", code="previous_response_not_found") from None


class Made:
    """One response being made: its ids and its shape, whole or as it streams."""

    def __init__(self, response_id: str, created: int, parsed: ResponsesRequest,
                 shape: ReplyShape):
        self.id, self.created, self.parsed, self.shape = response_id, created, parsed, shape
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self._call_ids: list[str] = []

    def call_item(self, n: int, call, status: str = "completed") -> dict:
        while len(self._call_ids) <= n:
            self._call_ids.append(f"fc_{uuid.uuid4().hex}")
        return {"type": "function_call", "id": self._call_ids[n],
                "call_id": self.shape.call(n, call)["id"], "name": call.name,
                "arguments": call.arguments, "status": status}

    def message_item(self, text: str, status: str = "completed") -> dict:
        return {"type": "message", "id": self.message_id, "status": status,
                "role": "assistant", "content": [{"type": "output_text", "text": text,
                                                  "annotations": [], "logprobs": []}]}

    def output(self, done: TurnUpdate) -> list[dict]:
        content, calls = self.shape.parts(done.text)
        return (([self.message_item(content)] if content or not calls else [])
                + [self.call_item(n, call) for n, call in enumerate(calls)])

    def response(self, done: TurnUpdate | None, status: str | None = None) -> dict:
        p = self.parsed
        cut = done is not None and done.finish_reason == "length"
        form = p.text.format if p.text is not None and p.text.format is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status or ("incomplete" if cut else "completed"), "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": p.instructions, "max_output_tokens": p.max_output_tokens,
            "model": p.model, "output": self.output(done) if done is not None else [],
            "parallel_tool_calls": p.parallel_tool_calls is not False,
            "previous_response_id": p.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": p.store is not False,
            "temperature": p.temperature, "top_p": p.top_p,
            "text": {"format": form.model_dump(by_alias=True, exclude_none=True)
                     if form is not None else {"type": "text"}},
            "tool_choice": (p.tool_choice.model_dump() if hasattr(p.tool_choice, "model_dump")
                            else p.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in p.tools or []],
            "truncation": "disabled", "metadata": p.metadata or {}, "user": p.user,
            "usage": usage_of(done) if done is not None else None,
        }


def usage_of(done: TurnUpdate) -> dict:
    s = done.stats
    return {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.reused},
            "output_tokens": s.generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.prompt_tokens + s.generated}
