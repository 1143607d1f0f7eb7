"""GET /v1/models: the model this server has loaded (none while it has none), as OpenAI lists
models; GET /v1/models/{id}: one of them (404 in OpenAI's shape for any other id)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request

from reame.chats.service import ChatService
from reame.web.v1.errors import ApiError, check_model


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
        return {"object": "list", "data": [_model(service, name) for name in model_ids()]}

    @router.get("/models/{model_id:path}")
    def get_model(request: Request, model_id: str):
        try:
            caller(request)
            check_model(model_id, model_ids())
        except ApiError as exc:
            return exc.response()
        return _model(service, model_id)


def _model(service: ChatService, name: str) -> dict:
    created = int(service.engine.model_path.stat().st_mtime) if service.engine else 0
    return {"id": name, "object": "model", "created": created, "owned_by": "reame"}
