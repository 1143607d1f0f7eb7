"""ChatService: chats (create, read, change, delete; each user sees only their own) and turns.

A stored chat's turn: its window of messages (window.py) becomes a Job for the TurnRunner
(turn.py), and the reply is kept as the chat's message and KV file (ChatKeeper). A stateless
conversation (the OpenAI route) is the same run with another Job and Keeper (conversation.py).
Turns run on the engine's thread (scheduler.py), several at once, each on its own slot; two
turns of one chat take turns (the second reads the history once the first's reply is kept). The
model and everything made for it is one ModelRuntime, replaced in one step at a model switch
(model_runtime.py). Every turn is a TurnStream: it ends, and frees its slot, however its caller
goes away (turn_stream.py, scheduler.py).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from reame.chats.chat_actions import ChatActions
from reame.chats.conversation import ReplyMemory
from reame.chats.model_holder import ModelHolder
from reame.chats.model_titles import TitleWriter
from reame.chats.store import Store
from reame.chats.store.stored_responses import ResponseNotFound, StoredResponses
from reame.chats.titles import title_from
from reame.chats.stateless_turns import StatelessTurns
from reame.chats.turns import Turns
from reame.config.chat_settings import ChatSettings
from reame.config.reame_conf import setting
from reame.config.refusals import (
    ChatError,
    ChatNotFound,
    EmptyMessage,
    MessageTooLong,
    NoModel,
    ServerBusy,
    TooManyChats,
)
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.kv.kvstore import REPLIES_NAME
from reame.inference.model_runtime import ModelRuntime
from reame.inference.tasks import Limits
from reame.inference.turn import TurnObserver, TurnStats, TurnUpdate

log = logging.getLogger(__name__)

__all__ = ["ChatService", "ChatError", "ChatNotFound", "EmptyMessage", "MessageTooLong",
           "NoModel", "ResponseNotFound", "ServerBusy", "StoredResponses", "TooManyChats",
           "TurnStats", "TurnUpdate", "title_from"]


class ChatService(ModelHolder, ChatActions, Turns, StatelessTurns):
    """Everything a user can do with chats; the UI and the API are thin layers over it."""

    def __init__(self, store: Store, engine: Engine | None, defaults: ChatSettings, *,
                 cache: KVCache | None = None, load_error: str | None = None,
                 max_chats: int = setting("storage", "max_chats_per_user").default,
                 limits: Limits = Limits(), runtime: ModelRuntime | None = None,
                 model_titles: bool = False):
        self.store = store
        self.max_chats = max_chats  # per user
        self._creating = threading.Lock()  # the count and the reservations, together
        self._reserved: dict[str | None, int] = {}  # user -> chats being made now
        self.defaults = defaults
        self.load_error = load_error
        self.limits = limits  # the line, stalled callers, fair shares (scheduler.py)
        # Without KV files, only the live context is reused (what plain servers do); without
        # an engine there is no runtime at all (None), and every path that uses it checks.
        self.runtime: ModelRuntime | None = runtime or (
            ModelRuntime(engine, cache or KVCache(engine, None), limits) if engine else None)
        self._switch = threading.Condition()  # a model switch under way: turns wait for it
        self._loading = False
        # The model a settings change is checking and loading (loading_from); turns wait for
        # it, API clients are told to come back.
        self.loading_model: Path | None = None
        # Stateless replies' exact tokens, kept beside the KV files that they find again
        # (where those are in a local folder; elsewhere, in memory only).
        folder = self.runtime.kv_folder if self.runtime is not None else None
        self.replies = ReplyMemory(path=folder / REPLIES_NAME if folder else None)
        self.observe_turn: TurnObserver | None = None  # told of every turn (metrics)
        self.warming = False  # the model runs once at start (warmup.py): not ready yet
        # After a chat's first reply the model writes its title, when idle (model_titles.py).
        self.titles = TitleWriter(lambda: self.runtime, store.retitle, enabled=model_titles)
