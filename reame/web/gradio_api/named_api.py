"""API endpoints for gradio_client: every chat action by name (see README, "API")."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Annotated, Any

import gradio as gr
from pydantic import BeforeValidator, ValidationError, create_model

from reame.admin.live_settings import Settings, SettingsError
from reame.chats.service import ChatError, ChatNotFound, ChatService
from reame.chats.store import END_MARK, MARK, Chat, Message, MessageTree
from reame.config.chat_settings import ChatSettings
from reame.config.setting import STRICT, WHOLE_NUMBER, first_problem
from reame.web.http.turn_updates import turn_updates
from reame.web.http.user import user_of


def chat_summary(chat: Chat) -> dict[str, Any]:
    return {"id": chat.id, "title": chat.title, "created_at": chat.created_at,
            "updated_at": chat.updated_at, "branched_from": chat.branched_from}


def message_dict(message: Message, tree: MessageTree, window_start: int = 0) -> dict[str, Any]:
    version, versions = tree.version(message)
    out = {"id": message.id, "parent_id": message.parent_id, "role": message.role,
           "content": message.content, "created_at": message.created_at,
           # whether the model still sees it (long chats drop their oldest messages)
           "in_window": message.position >= window_start,
           # an edit or a retry adds a version beside the old ones (/show_version)
           "version": version, "versions": versions}
    if message.role == "assistant":
        out["stopped"] = message.stopped
        out["stats"] = message.stats_dict or None
    return out


log = logging.getLogger(__name__)

INTERNAL_ERROR = ("Internal error: the server could not do this. The details are in its log; "
                  "your chats are unchanged.")


def _user_error(exc: Exception) -> gr.Error:
    return gr.Error(str(exc), print_exception=False)


def _text_number(value: Any) -> Any:
    """A whole number as a client may send it also as a text int() reads ("12")."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


# An endpoint's parameter annotations -> its pydantic type (strict: true is no number, "0.7" no
# float) and the words for what it must be.
KINDS: dict[str, tuple[Any, str]] = {
    "int": (Annotated[WHOLE_NUMBER, BeforeValidator(_text_number)], "a whole number"),
    "float": (float, "a number"),
    "str": (str, "a text"),
    "dict": (dict, "an object"),
}


def _checked(fn: Callable) -> Callable:
    """fn with its arguments checked first, by a pydantic model made from its annotations
    (KINDS): a client can send any JSON, and int([]) is not a refusal. A gr.Error says what the
    first wrong argument must be."""
    signature = inspect.signature(fn)
    fields, words = {}, {}
    for name, parameter in signature.parameters.items():
        annotation = str(parameter.annotation)
        kind, optional = annotation.removesuffix("| None").strip(), annotation.endswith("| None")
        if kind in KINDS:
            kind_type, words[name] = KINDS[kind]
            fields[name] = (kind_type | None if optional else kind_type, None)
            words[name] += " or null" if optional else ""
    arguments = create_model(f"{fn.__name__}_arguments", __config__=STRICT, **fields)

    def check(args, kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        given = {name: value for name, value in bound.arguments.items() if name in fields}
        try:
            valid = arguments.model_validate(given)
        except ValidationError as exc:
            name, _ = first_problem(exc)
            raise gr.Error(f"{name} must be {words[name]}", print_exception=False) from None
        bound.arguments.update({name: getattr(valid, name) for name in given})
        return bound.args, bound.kwargs

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args, **kwargs):
            args, kwargs = check(args, kwargs)
            async with aclosing(fn(*args, **kwargs)) as items:
                async for item in items:
                    yield item
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        args, kwargs = check(args, kwargs)
        return fn(*args, **kwargs)
    return call


def _guarded(fn: Callable) -> Callable:
    """fn for gr.api: its arguments checked (_checked); an unexpected exception is logged with
    its traceback, and the client gets INTERNAL_ERROR instead of the exception's text (SQL,
    paths, ...). gr.Error (what a caller can act on: an unknown chat, a refusal) passes."""

    def internal(exc: Exception) -> gr.Error:
        log.error("/%s failed", fn.__name__, exc_info=exc)
        return gr.Error(INTERNAL_ERROR, print_exception=False)

    checked = _checked(fn)
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args, **kwargs):
            try:
                async with aclosing(checked(*args, **kwargs)) as items:
                    async for item in items:
                        yield item
            except gr.Error:
                raise
            except Exception as exc:
                raise internal(exc) from None
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return checked(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            raise internal(exc) from None
    return call


def register_api(service: ChatService, *, settings_group: str,
                 settings: Settings | None = None,
                 can_configure: Callable[[str | None], bool] = lambda user: True) -> None:
    """Add the named endpoints to the Blocks being built. Each passes on the logged-in user
    (gr.Request): another user's chat is answered as if it did not exist."""

    def new_chat(title: str | None = "", system_prompt: str | None = None,
                 request: gr.Request = None) -> int:
        """Create a chat; an empty title becomes the first message; returns the chat id."""
        try:
            return service.new_chat(title or "", system_prompt, user=user_of(request)).id
        except ChatError as exc:
            raise _user_error(exc) from None

    async def _stream(start) -> AsyncIterator[str]:
        """The reply's text so far, update by update; a cancelled job stops the turn at once
        (turn_updates)."""
        try:
            async with aclosing(turn_updates(start)) as updates:
                async for update in updates:
                    if not update.queued:  # waiting for a slot: nothing to say yet
                        yield update.text
        except (ChatNotFound, ChatError) as exc:
            raise _user_error(exc) from None

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

    def type_ahead(chat_id: int, draft: str | None, request: gr.Request = None) -> int:
        """Evaluate what a message being typed already fixes of the next prompt (the page
        does it as you type); /send then evaluates only the rest. Never waits for the
        model: 0 when it is busy. Returns the tokens evaluated."""
        try:
            return service.type_ahead(int(chat_id), draft or "", user_of(request))
        except ChatNotFound as exc:
            raise _user_error(exc) from None

    def cache_stats(request: gr.Request = None) -> dict:
        """The KV cache: hit rate, tokens restored, time saved; with accounts, a user who is
        not an administrator gets the figures of their own turns only, without the files."""
        user = user_of(request)
        return service.cache_stats(user, whole_server=can_configure(user))

    def list_chats(request: gr.Request = None) -> list[dict]:
        """Your chats, most recently active first."""
        return [chat_summary(chat) for chat in service.list_chats(user_of(request))]

    def shown_chat(chat: Chat, tree: MessageTree, *, every_version: bool = False) -> dict:
        messages = tree.messages if every_version else tree.branch
        return {**chat_summary(chat), **ChatSettings.of(chat).as_dict(),
                "leaf_id": chat.leaf_id,
                "messages": [message_dict(m, tree, chat.window_start) for m in messages]}

    def get_chat(chat_id: int, request: gr.Request = None) -> dict:
        """One chat: its settings, and the messages of the branch shown, with each reply's
        stats and each message's version ("version" of "versions")."""
        try:
            chat, tree = service.tree(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise _user_error(exc) from None
        return shown_chat(chat, tree)

    # Named for the public endpoint /get_thread (its api_name is the function's name): the
    # chat's MessageTree, every version.
    def get_thread(chat_id: int, request: gr.Request = None) -> dict:
        """One chat with every version of every message, oldest first: a tree by parent_id,
        whose branch shown ends at leaf_id."""
        try:
            chat, tree = service.tree(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise _user_error(exc) from None
        return shown_chat(chat, tree, every_version=True)

    def show_version(chat_id: int, message_id: int, request: gr.Request = None) -> dict:
        """Show another version of a message (an earlier edit or reply) and the newest
        messages after it; returns the chat as /get_chat does."""
        user = user_of(request)
        try:
            service.show_version(int(chat_id), int(message_id), user)
            chat, tree = service.tree(int(chat_id), user)
        except (ChatNotFound, ChatError) as exc:
            raise _user_error(exc) from None
        return shown_chat(chat, tree)

    def branch(chat_id: int, message_id: int, request: gr.Request = None) -> int:
        """A new chat with this chat's messages up to message_id ("Branch from here"); its
        first turn restores their KV from this chat's file. Returns the new chat's id."""
        try:
            return service.branch(int(chat_id), int(message_id), user_of(request)).id
        except (ChatNotFound, ChatError) as exc:
            raise _user_error(exc) from None

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
            raise _user_error(exc) from None
        return {**chat_summary(chat), "pinned": chat.pinned}

    def archive_chat(chat_id: int, request: gr.Request = None) -> dict:
        """Archive a chat (out of your list, still found by search), or bring it back;
        returns it with "archived"."""
        try:
            chat = service.toggle_archive(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise _user_error(exc) from None
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
            raise _user_error(exc) from None

    def export_chats(request: gr.Request = None) -> str:
        """All your chats as one JSON document (docs/export-format.md)."""
        return service.export_file(None, user_of(request))["text"]

    def import_chats(data: str, request: gr.Request = None) -> list[int]:
        """Chats from the text of an export: Reame's JSON (one chat or all) or ChatGPT's
        conversations.json. All or nothing; returns the new chats' ids."""
        try:
            return [chat.id for chat in service.import_chats(data, user_of(request))]
        except ChatError as exc:
            raise _user_error(exc) from None

    def rename_chat(chat_id: int, title: str, request: gr.Request = None) -> dict:
        """Give a chat a new title."""
        try:
            return chat_summary(service.rename_chat(int(chat_id), title, user_of(request)))
        except (ChatNotFound, ChatError) as exc:
            raise _user_error(exc) from None

    def update_chat(chat_id: int, system_prompt: str | None = None,
                    temperature: float | None = None, top_p: float | None = None,
                    max_tokens: int | None = None, request: gr.Request = None) -> dict:
        """Change a chat's own settings (what the page's "Chat settings" edits); None keeps."""
        try:
            chat = service.update_settings(
                int(chat_id), system_prompt=system_prompt, temperature=temperature,
                top_p=top_p, max_tokens=max_tokens, user=user_of(request))
        except (ChatNotFound, ChatError) as exc:
            raise _user_error(exc) from None
        return {**chat_summary(chat), **ChatSettings.of(chat).as_dict()}

    def delete_chat(chat_id: int, request: gr.Request = None) -> bool:
        """Delete a chat and its messages."""
        try:
            service.delete_chat(int(chat_id), user_of(request))
        except ChatNotFound as exc:
            raise _user_error(exc) from None
        return True

    if settings is not None:
        _register_settings(settings, settings_group=settings_group, can_configure=can_configure)
    for fn in (send, regenerate, continue_reply, edit_message):
        # Any number at once: the scheduler runs them in turn, or says the server is full.
        gr.api(_guarded(fn), api_name=fn.__name__, concurrency_limit=None)
    for fn in (new_chat, list_chats, search_chats, get_chat, get_thread, show_version, branch,
               rename_chat, pin_chat, archive_chat, update_chat, delete_chat, export_chat,
               export_chats, import_chats, type_ahead, cache_stats):
        gr.api(_guarded(fn), api_name=fn.__name__, concurrency_limit=None)


def _register_settings(settings: Settings, *, settings_group: str,
                       can_configure: Callable[[str | None], bool]) -> None:
    def get_settings(request: gr.Request = None) -> dict:
        """reame.conf as the app runs it, the loaded model, and what can be changed here.

        With accounts, a user who is not an admin gets the loaded model's file name and the
        defaults of new chats only: no paths, files or server settings."""
        if not can_configure(user_of(request)):
            return settings.public()
        return settings.current()

    def list_models(request: gr.Request = None) -> list[dict]:
        """Every .gguf in models_dir and beside the current model, described from its header
        (nothing is loaded); each one's `model_path` is what update_settings takes. Admins
        only when there are accounts."""
        if not can_configure(user_of(request)):
            raise gr.Error("only an admin can list the model files", print_exception=False)
        # Not "path": Gradio takes a dict with a "path" for a file to send, and the client
        # then asks for the model file itself (refused: 403).
        return [{("model_path" if key == "path" else key): value for key, value in m.items()}
                for m in settings.models()]

    def update_settings(changes: dict, request: gr.Request = None) -> dict:
        """Change settings, e.g. {"model": {"model_path": "models/x.gguf", "n_ctx": 2048}}.

        Validated first; a new model is loaded while replies wait; reame.conf is written last.
        With accounts, only an admin may.
        """
        if not can_configure(user_of(request)):
            raise gr.Error("only an admin can change the settings", print_exception=False)
        if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in changes.values()):
            raise gr.Error('expected {"section": {"key": value}}', print_exception=False)
        try:
            return settings.update(changes)
        except SettingsError as exc:
            raise _user_error(exc) from None

    for fn in (get_settings, list_models):
        gr.api(_guarded(fn), api_name=fn.__name__, concurrency_limit=None)
    # Loading a model waits for replies in progress, and replies wait for it.
    gr.api(_guarded(update_settings), api_name="update_settings",
           concurrency_id=settings_group, concurrency_limit=1)
