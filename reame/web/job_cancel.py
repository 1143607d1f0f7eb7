"""gradio_client's Job.cancel() stops the job on the server, as the page's Stop does.

gradio_client (2.x) cancels a running job of an endpoint that no event of the page cancels (the
named API's /send, /regenerate, /edit_message) by posting its event id to /gradio_api/reset, which
Gradio 6 answers without doing anything: the job ran on, holding its slot. This route, included
before Gradio is mounted, answers it instead: it finds the event by its id and hands it to
Gradio's own /cancel (which the page's Stop uses), so the turn stops at once (web/turn_updates.py).
An event id is a random 128-bit value known only to the client that started the job.
"""

from __future__ import annotations

import logging

import gradio as gr
from fastapi import APIRouter, Request
from gradio.data_classes import CancelBody

log = logging.getLogger(__name__)


def build_job_cancel_router(demo: gr.Blocks) -> APIRouter:
    router = APIRouter()

    @router.post("/gradio_api/reset")
    @router.post("/gradio_api/reset/")
    async def reset(request: Request):
        try:
            event_id = str((await request.json()).get("event_id", ""))
        except (ValueError, AttributeError):
            return {"success": False}
        event = demo._queue.event_ids_to_events.get(event_id)
        cancel = _gradio_cancel(demo)
        if event is not None and cancel is not None:
            await cancel(CancelBody(session_hash=event.session_hash, fn_index=event.fn._id,
                                    event_id=event_id))
        return {"success": True}

    return router


def _gradio_cancel(demo: gr.Blocks):
    """The endpoint of Gradio's own POST /gradio_api/cancel (None if this Gradio has none)."""
    app = demo.server_app
    for route in getattr(app, "routes", ()):
        if getattr(route, "path", "") == "/gradio_api/cancel" and "POST" in getattr(
                route, "methods", ()):
            return route.endpoint
    log.warning("Gradio has no /gradio_api/cancel: a cancelled gradio_client job runs on")
    return None
