"""API endpoints for gradio_client: every chat action by name (docs/api.md). The endpoints are
registered by group: the settings' (settings_endpoints.py), those that write a reply
(reply_endpoints.py), the chats' (chat_endpoints.py), each checked and its errors kept inside
(guarded.py)."""

from __future__ import annotations

from collections.abc import Callable

from reame.admin.live_settings import Settings
from reame.chats.service import ChatService
from reame.web.gradio_api.chat_endpoints import register_chat_endpoints
from reame.web.gradio_api.reply_endpoints import register_reply_endpoints
from reame.web.gradio_api.settings_endpoints import register_settings_endpoints


def register_api(service: ChatService, *, settings_group: str,
                 settings: Settings | None = None,
                 can_configure: Callable[[str | None], bool] = lambda user: True) -> None:
    """Add the named endpoints to the Blocks being built. Each passes on the logged-in user
    (gr.Request): another user's chat is answered as if it did not exist."""
    if settings is not None:
        register_settings_endpoints(settings, settings_group=settings_group,
                                    can_configure=can_configure)
    register_reply_endpoints(service)
    register_chat_endpoints(service, can_configure)
