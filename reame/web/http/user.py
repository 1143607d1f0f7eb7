"""Who is asking: the logged-in user of a Gradio request."""

from __future__ import annotations

import gradio as gr


def user_of(request: gr.Request | None) -> str | None:
    """The logged-in user of a request (None when the app runs without accounts)."""
    return getattr(request, "username", None) if request is not None else None
