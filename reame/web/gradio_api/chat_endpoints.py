"""The named endpoints of chats (gradio_client's /new_chat, /list_chats, /get_chat, ...): make,
list, search, show (a version, every version), branch, pin, archive, rename, change, delete,
export and import a chat, prepare a message being typed, the cache's figures. Each passes on
the logged-in user (gr.Request): another user's chat is answered as if it did not exist."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from reame.chats.messages import END_MARK, MARK, ChatInfo, ChatMessage, ChatTree, Role
from reame.chats.service import ChatError, ChatNotFound, ChatService
from reame.config.chat_settings import ChatSettings
from reame.web.gradio_api.guarded import guarded, user_error
from reame.web.http.user import user_of


def chat_summary(chat: ChatInfo) -> dict[str, Any]:
    return {"id": chat.id, "title": chat.title, "created_at": chat.created_at,
            "updated_at": chat.updated_at, "branched_from": chat.branched_from}


def message_dict(message: ChatMessage, window_start: int = 0) -> dict[str, Any]:
    out = {"id": message.id, "parent_id": message.parent_id, "role": message.role,
           "content": message.content, "created_at": message.created_at,
           # whether the model still sees it (long chats drop their oldest messages)
           "in_window": message.position >= window_start,
           # an edit or a retry adds a version beside the old ones (/show_version)
           "version": message.version, "versions": message.versions}
    if message.role == Role.ASSISTANT:
        out["stopped"] = message.stopped
        out["stats"] = message.stats or None
    if message.tool_calls:  # the tools a reply called (X-Reame-Chat with tools)
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:  # a tool's result: the call it answers
        out["tool_call_id"] = message.tool_call_id
    return out


def register_chat_endpoints(service: ChatService,
                            can_configure: Callable[[str | None], bool]) -> None:
    """Add the chats' named endpoints to the Blocks being built; can_configure(user): whether
    the user sees the whole server's cache figures."""

    def new_chat(title: str | None = "", system_prompt: str | None = None,
                 request: gr.Request = None) -> int:
        """Create a chat; an empty title becomes the first message; returns the chat id."""
        try:
            return service.new_chat(title or "", system_prompt, user=user_of(request)).id
        except ChatError as exc:
            raise user_error(exc) from None

    def type_ahead(chat_id: int, draft: str | None, request: gr.Request = None) -> int:
        """Evaluate what a message being typed already fixes of the next prompt (the page
        does it as you type); /send then evaluates only the rest. Never waits for the
        model: 0 when it is busy. Returns the tokens evaluated."""
        try:
            return service.type_ahead(int(chat_id), draft or "", user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None

    def cache_stats(request: gr.Request = None) -> dict:
        """The KV cache: hit rate, tokens restored, time saved; with accounts, a user who is
        not an administrator gets the figures of their own turns only, without the files."""
        user = user_of(request)
        return service.cache_stats(user, whole_server=can_configure(user))

    def list_chats(request: gr.Request = None) -> list[dict]:
        """Your chats, most recently active first."""
        return [chat_summary(chat) for chat in service.list_chats(user_of(request))]

    def shown_chat(chat: ChatInfo, tree: ChatTree, *, every_version: bool = False) -> dict:
        messages = tree.messages if every_version else tree.branch
        return {**chat_summary(chat), **ChatSettings.of(chat).as_dict(),
                "leaf_id": chat.leaf_id,
                "messages": [message_dict(m, chat.window_start) for m in messages]}

    def get_chat(chat_id: int, request: gr.Request = None) -> dict:
        """One chat: its settings, and the messages of the branch shown, with each reply's
        stats and each message's version ("version" of "versions")."""
        try:
            chat, tree = service.tree(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None
        return shown_chat(chat, tree)

    # Named for the public endpoint /get_thread (its api_name is the function's name): the
    # chat's ChatTree, every version.
    def get_thread(chat_id: int, request: gr.Request = None) -> dict:
        """One chat with every version of every message, oldest first: a tree by parent_id,
        whose branch shown ends at leaf_id."""
        try:
            chat, tree = service.tree(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None
        return shown_chat(chat, tree, every_version=True)

    def show_version(chat_id: int, message_id: int, request: gr.Request = None) -> dict:
        """Show another version of a message (an earlier edit or reply) and the newest
        messages after it; returns the chat as /get_chat does."""
        user = user_of(request)
        try:
            service.show_version(int(chat_id), int(message_id), user)
            chat, tree = service.tree(int(chat_id), user)
        except (ChatNotFound, ChatError) as exc:
            raise user_error(exc) from None
        return shown_chat(chat, tree)

    def branch(chat_id: int, message_id: int, request: gr.Request = None) -> int:
        """A new chat with this chat's messages up to message_id ("Branch from here"); its
        first turn restores their KV from this chat's file. Returns the new chat's id."""
        try:
            return service.branch(int(chat_id), int(message_id), user_of(request)).id
        except (ChatNotFound, ChatError) as exc:
            raise user_error(exc) from None

    def search_chats(words: str, request: gr.Request = None) -> list[dict]:
        """Your chats whose title or messages hold every word (the last may be a word's
        start), most recent first, each with "snippet": a matching message's words around
        the match, the match between [[ and ]] ("" when only the title matched)."""
        found = service.search(words, user_of(request))
        return [{**chat_summary(f.chat), "snippet": f.snippet.replace(MARK, "[[").replace(
            END_MARK, "]]")} for f in found]

    def pin_chat(chat_id: int, request: gr.Request = None) -> dict:
        """Pin a chat to the top of your list, or unpin it; returns it with "pinned"."""
        try:
            chat = service.toggle_pin(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None
        return {**chat_summary(chat), "pinned": chat.pinned}

    def archive_chat(chat_id: int, request: gr.Request = None) -> dict:
        """Archive a chat (out of your list, still found by search), or bring it back;
        returns it with "archived"."""
        try:
            chat = service.toggle_archive(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None
        return {**chat_summary(chat), "archived": chat.archived}

    def export_chat(chat_id: int, format: str | None = "json",
                    request: gr.Request = None) -> str:
        """One chat as a file's text: "json" (every version; docs/export-format.md) or
        "markdown" (the branch shown)."""
        if format not in ("json", "markdown"):
            raise gr.Error('format must be "json" or "markdown"', print_exception=False)
        try:
            return service.export_file(int(chat_id), user_of(request),
                                       markdown=format == "markdown")["text"]
        except ChatNotFound as exc:
            raise user_error(exc) from None

    def export_chats(request: gr.Request = None) -> str:
        """All your chats as one JSON document (docs/export-format.md)."""
        return service.export_file(None, user_of(request))["text"]

    def import_chats(data: str, request: gr.Request = None) -> list[int]:
        """Chats from the text of an export: Reame's JSON (one chat or all) or ChatGPT's
        conversations.json. All or nothing; returns the new chats' ids."""
        try:
            return [chat.id for chat in service.import_chats(data, user_of(request))]
        except ChatError as exc:
            raise user_error(exc) from None

    def rename_chat(chat_id: int, title: str, request: gr.Request = None) -> dict:
        """Give a chat a new title."""
        try:
            return chat_summary(service.rename_chat(int(chat_id), title, user_of(request)))
        except (ChatNotFound, ChatError) as exc:
            raise user_error(exc) from None

    def update_chat(chat_id: int, system_prompt: str | None = None,
                    temperature: float | None = None, top_p: float | None = None,
                    max_tokens: int | None = None, request: gr.Request = None) -> dict:
        """Change a chat's own settings (what the page's "Chat settings" edits); None keeps."""
        try:
            chat = service.update_settings(
                int(chat_id), system_prompt=system_prompt, temperature=temperature,
                top_p=top_p, max_tokens=max_tokens, user=user_of(request))
        except (ChatNotFound, ChatError) as exc:
            raise user_error(exc) from None
        return {**chat_summary(chat), **ChatSettings.of(chat).as_dict()}

    def get_instructions(request: gr.Request = None) -> dict:
        """Your custom instructions: how to answer and about you (empty: none)."""
        mine = service.instructions(user_of(request))
        return {"how_to_answer": mine.how_to_answer, "about_me": mine.about_me}

    def set_instructions(how_to_answer: str | None = "", about_me: str | None = "",
                         request: gr.Request = None) -> dict:
        """Keep your custom instructions for the chats you start from now on (both empty:
        none); returns them as kept."""
        try:
            kept = service.set_instructions(how_to_answer, about_me, user=user_of(request))
        except ChatError as exc:
            raise user_error(exc) from None
        return {"how_to_answer": kept.how_to_answer, "about_me": kept.about_me}

    def delete_chat(chat_id: int, request: gr.Request = None) -> bool:
        """Delete a chat and its messages."""
        try:
            service.delete_chat(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise user_error(exc) from None
        return True
    for fn in (new_chat, list_chats, search_chats, get_chat, get_thread, show_version, branch,
               rename_chat, pin_chat, archive_chat, update_chat, delete_chat, export_chat,
               export_chats, import_chats, type_ahead, cache_stats, get_instructions,
               set_instructions):
        gr.api(guarded(fn), api_name=fn.__name__, concurrency_limit=None)
