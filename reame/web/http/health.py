"""GET /health: whether this server can answer now, for a load balancer, systemd or a probe.

200 {"status": "ok"} while it serves; 503 {"status": "loading"} (with Retry-After) while a
model loads, 503 {"status": "no_model"} when none is loaded, 503 {"status": "warming_up"}
while the model runs once at start (reame/inference/warmup.py), so that the first request is
as fast as the next. No login is needed, so it says
nothing more: no model name, path or error text (the Settings tab and the log have those).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from reame.chats.service import ChatService
from reame.config.refusals import RETRY_LOADING_S, RETRY_WARMING_S


def build_health_router(service: ChatService) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    def health() -> JSONResponse:
        if service.loading:
            return JSONResponse({"status": "loading"}, status_code=503,
                                headers={"Retry-After": str(RETRY_LOADING_S)})
        if service.engine is None:
            return JSONResponse({"status": "no_model"}, status_code=503)
        if service.warming:
            return JSONResponse({"status": "warming_up"}, status_code=503,
                                headers={"Retry-After": str(RETRY_WARMING_S)})
        return JSONResponse({"status": "ok"})

    return router
