"""The /v1 routes, OpenAI-compatible, on the app's own server: GET /v1/models (model_list.py),
POST /v1/chat/completions (chat_completions.py), POST /v1/completions (completions.py) and
Anthropic's POST /v1/messages (messages.py), POST/GET/DELETE /v1/responses (responses.py), with the key (Authorization: Bearer, or x-api-key)
and readiness checks they share.

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

from fastapi import APIRouter, Request

from reame.accounts.live import LiveAccounts
from reame.chats.service import ChatService
from reame.web.v1.chat_completions import add_chat_completions
from reame.web.v1.completions import add_completions
from reame.web.v1.errors import ApiError
from reame.web.v1.messages import add_messages
from reame.web.v1.model_list import add_model_list
from reame.web.v1.responses import add_responses


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
            # Anthropic's SDKs send the key as x-api-key.
            key = request.headers.get("x-api-key", "")
        if not key.strip():
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>' or "
                           "'x-api-key: <key>' (make one with `python app.py addkey NAME`)",
                           type_="authentication_error", code="missing_api_key")
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

    add_model_list(router, service, caller, model_ids)
    add_chat_completions(router, service, caller, ready, model_ids)
    add_completions(router, service, caller, ready, model_ids)
    add_messages(router, service, caller, ready)
    add_responses(router, service, caller, ready, model_ids)

    # Last: any other path under /v1 is a 404 in OpenAI's shape (a known path asked with
    # another method, a 405), never FastAPI's {"detail": "Not Found"}.
    known = {route.path for route in router.routes}

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"],
                      include_in_schema=False)
    def unknown(path: str, request: Request):
        if f"/v1/{path}" in known:
            return ApiError(405, f"{request.method} is not allowed on /v1/{path}",
                            code="method_not_allowed").response()
        return ApiError(404, f"Unknown path: {request.method} /v1/{path} (see docs/api.md)",
                        code="unknown_url").response()

    return router
