"""GET /v1/models: the model this server has loaded (none while it has none), as OpenAI lists
models."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request

from reame.chats.service import ChatService
from reame.web.v1.errors import ApiError


def add_model_list(router: APIRouter, service: ChatService,
                   caller: Callable[[Request], str | None],
                   model_ids: Callable[[], list[str]]) -> None:
    """Add GET /models to the /v1 router, with its key check (caller) and its models."""

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
