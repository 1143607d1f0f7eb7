"""The named endpoints that write a reply (gradio_client's /send, /regenerate, /continue_reply,
/edit_message): each streams the reply's text so far, the last value being the whole reply; a
cancelled job stops its turn at once. Each passes on the logged-in user (gr.Request)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import gradio as gr

from reame.chats.service import ChatError, ChatNotFound, ChatService
from reame.web.gradio_api.guarded import guarded, user_error
from reame.web.http.turn_updates import turn_updates
from reame.web.http.user import user_of


def register_reply_endpoints(service: ChatService) -> None:
    """Add the named endpoints that write a reply to the Blocks being built."""

    async def _stream(start) -> AsyncIterator[str]:
        """The reply's text so far, update by update; a cancelled job stops the turn at once
        (turn_updates)."""
        try:
            async with aclosing(turn_updates(start)) as updates:
                async for update in updates:
                    if not update.queued:  # waiting for a slot: nothing to say yet
                        yield update.text
        except (ChatNotFound, ChatError) as exc:
            raise user_error(exc) from None

    async def send(chat_id: int, message: str,
                   request: gr.Request = None) -> AsyncIterator[str]:
        """Send a message; streams the reply so far, the last value being the whole reply."""
        user = user_of(request)
        async with aclosing(_stream(lambda: service.send(int(chat_id), message,
                                                         user=user))) as texts:
            async for text in texts:
                yield text

    async def regenerate(chat_id: int, request: gr.Request = None) -> AsyncIterator[str]:
        """Replace the last reply with a new one; streams it like /send."""
        user = user_of(request)
        async with aclosing(_stream(lambda: service.regenerate(int(chat_id),
                                                               user=user))) as texts:
            async for text in texts:
                yield text

    async def continue_reply(chat_id: int, request: gr.Request = None) -> AsyncIterator[str]:
        """Make the last reply go on where it stopped (cut at max_tokens): its KV reused, kept
        as a new version of it; streams the whole reply like /send."""
        user = user_of(request)
        async with aclosing(_stream(lambda: service.continue_reply(int(chat_id),
                                                                   user=user))) as texts:
            async for text in texts:
                yield text

    async def edit_message(chat_id: int, message_id: int, message: str,
                           request: gr.Request = None) -> AsyncIterator[str]:
        """Replace one of the user's messages, drop what followed, and stream the new reply."""
        user = user_of(request)
        async with aclosing(_stream(lambda: service.edit_message(
                int(chat_id), int(message_id), message, user=user))) as texts:
            async for text in texts:
                yield text

    for fn in (send, regenerate, continue_reply, edit_message):
        # Any number at once: the scheduler runs them in turn, or says the server is full.
        gr.api(guarded(fn), api_name=fn.__name__, concurrency_limit=None)
