"""What a user does with their chats: create, read, change, delete, branch, export, import,
search; a chat of another user is answered as if it did not exist (ChatNotFound)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from reame.chats.instructions import Instructions, checked
from reame.chats.jsontext import lone_surrogate
from reame.chats.messages import ChatInfo, ChatMessage, ChatTree, FoundChat
from reame.chats.store import Chat, MessageNotFound, MessageTree
from reame.chats.store.instructions import InstructionsStore
from reame.chats.store.stored_responses import StoredResponses
from reame.chats.titles import DEFAULT_TITLE, checked_title
from reame.chats.transfer import BadImport, export_all, export_chat, parse_import, to_markdown
from reame.config.chat_settings import ChatSettings
from reame.config.refusals import (
    ChatError,
    ChatNotFound,
    TooManyChats,
)
from reame.inference.scope import user_scope

log = logging.getLogger(__name__)


class ChatActions:
    """ChatService's chat actions (a mixin: the state is ChatService.__init__'s)."""

    # chats
    #
    # Every method that takes a chat id takes the user asking (None without accounts): a chat
    # of another user is answered as if it did not exist (ChatNotFound). What they return is
    # the faces' view of the rows (messages.py: ChatInfo, ChatMessage, ChatTree, FoundChat);
    # the rows themselves stay in reame/chats.

    def new_chat(self, title: str = "", system_prompt: str | None = None, *,
                 user: str | None = None) -> ChatInfo:
        """A chat with the server's default settings and the user's custom instructions (or
        system_prompt, if given, instead of both)."""
        title = checked_title(title) or DEFAULT_TITLE
        settings = self._defaults_for(user).changed(system_prompt=system_prompt)
        with self._room_for_a_chat(user):
            return ChatInfo.of(self.store.create_chat(title=title, owner=user,
                                                      **settings.as_dict()))

    def empty_chat(self, user: str | None = None) -> ChatInfo:
        """The page's "New chat": the user's newest chat if it is still empty and untitled
        (and would start as a new one does), else a new one (pressing it twice does not make
        two empty chats)."""
        newest = self.store.newest_chat(user)
        if (newest is not None and newest.leaf_id is None and newest.title == DEFAULT_TITLE
                and ChatSettings.of(newest) == self._defaults_for(user)):
            return ChatInfo.of(newest)
        return self.new_chat(user=user)

    # custom instructions (instructions.py)

    def instructions(self, user: str | None = None) -> Instructions:
        return Instructions(*InstructionsStore(self.store).get(user))

    def set_instructions(self, how_to_answer: str | None, about_me: str | None, *,
                         user: str | None = None) -> Instructions:
        """Keep the user's custom instructions for the chats they start from now on (both
        empty: none); ChatError if one is too long."""
        kept = checked(how_to_answer, about_me)
        InstructionsStore(self.store).put(user, kept.how_to_answer, kept.about_me)
        return kept

    def _defaults_for(self, user: str | None) -> ChatSettings:
        """The settings a new chat of user starts with: the server's, the user's
        instructions after its system prompt."""
        mine = self.instructions(user)
        if not mine:
            return self.defaults
        return self.defaults.changed(system_prompt=mine.system_prompt(
            self.defaults.system_prompt))

    @contextmanager
    def _room_for_a_chat(self, user: str | None, count: int = 1) -> Iterator[None]:
        """Create count chats in the block, unless the user would have more than max_chats
        (TooManyChats). The room is reserved under a short lock, and the chats made outside
        it: a long import makes nobody else wait (nor the same user's "New chat")."""
        with self._creating:
            if (self.store.count_chats(user) + self._reserved.get(user, 0) + count
                    > self.max_chats):
                raise TooManyChats(
                    f"you have {self.max_chats:,} chats, the most this server keeps for one "
                    f"user: delete some to start a new one" if count == 1 else
                    f"this would make more than {self.max_chats:,} chats, the most this "
                    f"server keeps for one user")
            self._reserved[user] = self._reserved.get(user, 0) + count
        try:
            yield
        finally:
            with self._creating:
                self._reserved[user] -= count
                if not self._reserved[user]:
                    del self._reserved[user]

    def list_chats(self, user: str | None = None, limit: int | None = None, *,
                   archived: bool | None = None) -> list[ChatInfo]:
        return [ChatInfo.of(chat)
                for chat in self.store.list_chats(owner=user, limit=limit, archived=archived)]

    def count_chats(self, user: str | None = None, *, archived: bool | None = None) -> int:
        return self.store.count_chats(user, archived=archived)

    def latest_chat(self, user: str | None = None) -> ChatInfo | None:
        """The user's most recently active chat, pinned or not: the one a page opens on."""
        chat = self.store.newest_chat(user, active=True)
        return ChatInfo.of(chat) if chat is not None else None

    def get_chat(self, chat_id: int, user: str | None = None) -> ChatInfo:
        return ChatInfo.of(self._chat(chat_id, user))

    def _chat(self, chat_id: int, user: str | None) -> Chat:
        """The chat's row, if it is the user's (else ChatNotFound)."""
        chat = self.store.get_chat(chat_id)
        if chat.owner != user:
            raise ChatNotFound(chat_id)
        return chat

    def from_before_accounts(self, chat_id: int) -> bool:
        """Whether chat_id is a chat from before accounts (nobody's until an administrator
        adopts it); False if there is no such chat."""
        try:
            return self.store.get_chat(chat_id).owner is None
        except ChatNotFound:
            return False

    def messages(self, chat_id: int, user: str | None = None) -> list[ChatMessage]:
        """The branch shown, first message first."""
        return self.chat_and_messages(chat_id, user)[1]

    def chat_and_messages(self, chat_id: int,
                          user: str | None = None) -> tuple[ChatInfo, list[ChatMessage]]:
        """A chat and the messages of its branch shown ([] if it was deleted meanwhile)."""
        chat = self._chat(chat_id, user)
        try:
            tree = self.store.tree(chat_id)
        except ChatNotFound:
            return ChatInfo.of(chat), []
        return ChatInfo.of(chat), list(ChatTree.of(tree).branch)

    def tree(self, chat_id: int, user: str | None = None) -> tuple[ChatInfo, ChatTree]:
        """A chat and all its messages, every version (the branch shown: tree.branch): what
        a page or /get_chat shows."""
        chat, tree = self._tree(chat_id, user)
        return ChatInfo.of(chat), ChatTree.of(tree)

    def _tree(self, chat_id: int, user: str | None) -> tuple[Chat, MessageTree]:
        chat = self._chat(chat_id, user)
        return chat, self.store.tree(chat_id)

    def show_version(self, chat_id: int, message_id: int,
                     user: str | None = None) -> list[ChatMessage]:
        """Show another version of a message (an edit or a retry kept beside it) and the
        newest messages after it; the branch now shown."""
        chat = self._chat(chat_id, user)
        try:
            branch = self.store.show_version(chat_id, message_id)
        except MessageNotFound as exc:
            raise ChatError(str(exc)) from None
        shown = next(m for m in branch if m.id == message_id)
        if shown.position < chat.window_start:  # a branch the window was not made for
            self.store.update_chat(chat_id, window_start=0)
        return self.messages(chat_id, user)

    def branch(self, chat_id: int, message_id: int, user: str | None = None) -> ChatInfo:
        """A new chat holding this chat's history up to message_id (any of its messages):
        "Branch from here". Its first turn restores the KV they share from this chat's file."""
        chat, tree = self._tree(chat_id, user)
        if message_id not in tree.by_id:
            raise ChatError(f"message {message_id} is not in chat {chat_id}")
        history = tree.branch_to(message_id)
        with self._room_for_a_chat(user):
            copy = self.store.create_chat(
                title=checked_title(f"{chat.title} (branch)"), owner=user,
                branched_from=chat.id, **ChatSettings.of(chat).as_dict())
        self.store.copy_messages(copy.id, history)
        if chat.window_start <= history[-1].position:
            copy = self.store.update_chat(copy.id, window_start=chat.window_start)
        return ChatInfo.of(copy)

    def export_file(self, chat_id: int | None, user: str | None = None, *,
                    markdown: bool = False) -> dict[str, str]:
        """A chat (None: all the user's chats) as a file to save: {"name", "type", "text"};
        JSON in Reame's documented format (transfer.py), or the branch shown as Markdown."""
        if chat_id is None:
            chats = [self._tree(chat.id, user) for chat in self.store.list_chats(user)]
            return {"name": "reame-chats.json", "type": "application/json",
                    "text": json.dumps(export_all(chats), ensure_ascii=False, indent=1)}
        chat, tree = self._tree(chat_id, user)
        name = re.sub(r"[^\w-]+", "-", chat.title).strip("-")[:60] or "chat"
        if markdown:
            return {"name": f"{name}.md", "type": "text/markdown",
                    "text": to_markdown(chat, tree)}
        return {"name": f"{name}.json", "type": "application/json",
                "text": json.dumps(export_chat(chat, tree), ensure_ascii=False, indent=1)}

    def import_chats(self, data: bytes | str, user: str | None = None) -> "Imported":
        """Chats from an export: Reame's JSON (one chat or all) or ChatGPT's
        conversations.json. All or nothing is checked before anything is stored (BadImport,
        TooManyChats); their KV is built on their first turn. The chats made, newest first."""
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadImport(f"the file is not JSON ({exc})") from None
        except RecursionError:
            raise BadImport("the file's JSON is nested too deeply") from None
        where = lone_surrogate(parsed)
        if where is not None:
            raise BadImport(f"{where} is not valid text (it holds a lone UTF-16 surrogate)")
        imported = parse_import(parsed)
        # A ChatGPT chat this user has already (the same title and date: the same file
        # imported again) is not made twice. A Reame export imported again is a copy.
        here = {(c.title, c.created_at) for c in self.store.list_chats(user)}
        fresh = [c for c in imported if not c.from_elsewhere or c.created_at is None
                 or (c.title, c.created_at) not in here]
        settings = [chat.settings_over(self.defaults) for chat in fresh]
        made = []
        with self._room_for_a_chat(user, len(fresh)):
            try:
                for chat, chosen in zip(fresh, settings):
                    made.append(self.store.create_chat(title=chat.title, owner=user,
                                                       created_at=chat.created_at,
                                                       **chosen.as_dict()))
                    self.store.add_tree(made[-1].id, chat.messages, chat.current)
                    last = max((m.created_at for m in chat.messages
                                if m.created_at is not None), default=chat.created_at)
                    # In the list by its own days, not the import's; pinned or archived as
                    # it was.
                    self.store.update_chat(made[-1].id, pinned=chat.pinned,
                                           archived=chat.archived,
                                           **({"updated_at": last} if last is not None else {}))
            except BaseException:  # all or nothing: the chats made so far go again
                for chat in made:
                    self.store.delete_chat(chat.id)
                raise
        return Imported([self.get_chat(chat.id, user) for chat in reversed(made)],
                        skipped=len(imported) - len(fresh))

    def search(self, words: str, user: str | None = None) -> list[FoundChat]:
        """The user's chats whose title or messages hold every word (Store.search)."""
        return [FoundChat.of(found) for found in self.store.search(user, words)]

    def toggle_pin(self, chat_id: int, user: str | None = None) -> ChatInfo:
        """Pin the chat to the top of the list, or unpin it."""
        chat = self._chat(chat_id, user)
        return ChatInfo.of(self.store.update_chat(chat_id, pinned=not chat.pinned))

    def toggle_archive(self, chat_id: int, user: str | None = None) -> ChatInfo:
        """Archive the chat (out of the list, still found by search), or bring it back."""
        chat = self._chat(chat_id, user)
        return ChatInfo.of(self.store.update_chat(chat_id, archived=not chat.archived))

    def rename_chat(self, chat_id: int, title: str, user: str | None = None) -> ChatInfo:
        self._chat(chat_id, user)
        title = checked_title(title)
        if not title:
            raise ChatError("a chat title cannot be empty")
        return ChatInfo.of(self.store.update_chat(chat_id, title=title))

    def update_settings(self, chat_id: int, *, user: str | None = None,
                        **changes: Any) -> ChatInfo:
        """Change a chat's own settings (chat_settings.FIELDS); None keeps a value."""
        settings = ChatSettings.of(self._chat(chat_id, user)).changed(**changes)
        # Only the changed ones: two changes at once (the page's fields) must not undo another.
        return ChatInfo.of(self.store.update_chat(chat_id, **{
            name: getattr(settings, name) for name, value in changes.items()
            if value is not None}))

    def delete_chat(self, chat_id: int, user: str | None = None) -> None:
        self._chat(chat_id, user)
        self.store.delete_chat(chat_id)
        if self.cache:
            self.cache.forget(chat_id)

    def cache_stats(self, user: str | None = None, *, whole_server: bool = True) -> dict:
        """The KV cache's figures: the whole server's and its files (for an administrator),
        or only those of user's own turns."""
        if not self.cache:
            return {"enabled": False}
        stats = self.cache.stats(None if whole_server else user_scope(user))
        chats = self.store.chat_ids() if whole_server else {
            chat.id for chat in self.store.list_chats(user)}
        stats["chats_ready"] = self.cache.chats_ready(chats)
        return stats

    def stored_responses(self) -> StoredResponses:
        """/v1/responses' stored responses, in this service's database."""
        return StoredResponses(self.store)


class Imported(list):
    """The chats an import made, newest first, and how many of the file's were here already."""

    def __init__(self, chats: list[ChatInfo], *, skipped: int = 0):
        super().__init__(chats)
        self.skipped = skipped
