"""The service's current model: the ModelRuntime a turn takes once, a switch to another
model (turns wait for it), the shared default prompt, and stopping turns."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from reame.config.chat_settings import ChatSettings
from reame.config.refusals import (
    ChatNotFound,
    NoModel,
)
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.model_runtime import ModelRuntime
from reame.inference.prompt import PromptBuilder
from reame.inference.scheduler import Scheduler
from reame.inference.scope import SHARED
from reame.inference.tasks import Replaced

log = logging.getLogger(__name__)


def _runtime_part(name: str):
    """A read-only attribute: that part of the current ModelRuntime, None without a model."""
    return property(lambda self: getattr(self.runtime, name) if self.runtime else None)


class ModelHolder:
    """ChatService's model (a mixin: the state is ChatService.__init__'s)."""

    # The current runtime's parts (None without a model). A turn takes the runtime once and
    # uses it throughout; these are for reading (metrics, the page, tests).
    engine: Engine | None = _runtime_part("engine")
    cache: KVCache | None = _runtime_part("cache")
    prompts: PromptBuilder | None = _runtime_part("prompts")
    scheduler: Scheduler | None = _runtime_part("scheduler")

    @property
    def max_waiting(self) -> int:
        return self.limits.max_waiting

    @contextmanager
    def using_model(self) -> Iterator[ModelRuntime]:
        """The current runtime, leased for the block (its engine stays open): once a model
        switch under way is done; NoModel without one. For straight-line work only."""
        while True:
            runtime = self._current()
            try:
                with runtime.lease():
                    yield runtime
                return
            except Replaced:
                if runtime.retired and self.runtime is not runtime:
                    continue  # switched meanwhile: the new one
                raise

    def _current(self) -> ModelRuntime:
        """The runtime turns go to, once a model switch under way is done (NoModel: none)."""
        with self._switch:
            # Also while a new model is only checked: the page already says it loads, and a
            # turn begun on the old model now would be stopped by the switch a moment later.
            while self._loading or self.loading_model is not None:
                self._switch.wait()
            runtime = self.runtime
        if runtime is None:
            raise NoModel(self.load_error or "no model is loaded")
        return runtime

    @property
    def loading(self) -> bool:
        """A model is being checked or loaded (a settings change), or the engine replaced."""
        return self._loading or self.loading_model is not None

    @contextmanager
    def loading_from(self, path: Path) -> Iterator[None]:
        """Say, while the block runs, that the model at path is being checked and loaded."""
        with self._switch:
            self.loading_model = path
        try:
            yield
        finally:
            with self._switch:
                self.loading_model = None
                self._switch.notify_all()  # turns that waited: on whichever model serves

    def replace_engine(self, load: Callable[[], tuple[Engine, KVCache]]) -> None:
        """Switch to the engine load() builds (replace_runtime)."""
        self.replace_runtime(lambda: ModelRuntime(*load(), self.limits))

    def reload_after_a_crash(self, load: Callable[[], ModelRuntime]) -> None:
        """If the runtime's model runs in a process of its own, load() a new one whenever that
        process ends unasked (the turns under way ended with EngineCrashed meanwhile)."""
        self._reload = load
        self._watch(self.runtime)

    def _watch(self, runtime: ModelRuntime | None) -> None:
        deaths = getattr(runtime, "on_death", None)
        if (deaths is not None and getattr(self, "_reload", None) is not None
                and self._crashed not in deaths):
            deaths.append(self._crashed)

    def _crashed(self, runtime) -> None:
        def reload() -> None:
            if self.runtime is not runtime:
                return  # switched meanwhile
            log.warning("the model's process ended: loading the model again")
            try:
                self.replace_runtime(self._reload)
            except Exception as exc:
                log.exception("the model could not be loaded again")
                self.load_error = f"the model's process ended and could not start again: {exc}"

        threading.Thread(target=reload, name="reame-reload", daemon=True).start()

    def replace_runtime(self, load: Callable[[], ModelRuntime]) -> None:
        """Switch to the runtime load() builds, as one step: the turns under way are stopped
        (each keeps what it wrote), new turns and those waiting for a slot wait for the new
        model. If it fails to load, the current one serves on and the error propagates."""
        with self._switch:
            while self._loading:  # one switch at a time
                self._switch.wait()
            self._loading = True
        old = self.runtime
        try:
            if old is not None:
                old.retire()  # its files complete before a new store reads them
            try:
                runtime = load()
            except BaseException:
                if old is not None and not getattr(old, "retired_for_good", False):
                    self.runtime = old.reopened()
                raise
            self.runtime = runtime
            self._watch(runtime)
            self.load_error = None
        finally:
            with self._switch:
                self._loading = False
                self._switch.notify_all()
        if old is not None:
            old.close()
        log.info("now serving %s", self.runtime.engine.name)
        self.share_default_prompt(self.runtime)  # not using_model: its switch is not over

    def set_defaults(self, defaults: ChatSettings) -> None:
        """New chats' settings from now on (a settings change)."""
        self.defaults = defaults
        self.share_default_prompt()

    def share_default_prompt(self, runtime: ModelRuntime | None = None) -> None:
        """Put the default system prompt's opening on disk for every user (KVCache.share),
        with runtime (the current one by default)."""
        runtime = runtime or self.runtime
        if runtime is None or not runtime.cache.enabled:
            return
        try:
            with runtime.lease():
                opening = runtime.prompts.fixed_head(self.defaults.system_prompt, [], SHARED)
                # Maintenance, not a request: only on a slot free now, so that the change it
                # follows never waits for replies or fails on a full line; else the first new
                # chat computes the opening.
                shared = runtime.share(opening, SHARED)
        except Replaced:  # switched meanwhile: the next switch shares it for its model
            return
        if not shared:
            log.info("the default prompt's opening was not shared: every slot is busy")

    def close(self) -> None:
        """Stop the turns under way (each keeps what it wrote) and the engine's thread, and
        write the KV files; the engine stays open."""
        if self.runtime is not None:
            self.runtime.scheduler.stop(cancel=True)
            self.runtime.cache.flush()

    def stop_turn(self, chat_id: int, user: str | None = None) -> bool:
        """Stop the chat's reply being written or waiting (the page's Stop), from any thread:
        it keeps what it wrote, and its slot is free within one decode. False if none."""
        self._chat(chat_id, user)
        runtime = self.runtime
        return runtime is not None and runtime.scheduler.cancel_chat(chat_id) > 0

    def writing(self, user: str | None = None) -> set[int]:
        """The user's chats with a reply being written or waiting for a slot."""
        runtime = self.runtime
        if runtime is None:
            return set()
        mine = set()
        for chat_id in runtime.scheduler.writing():
            try:
                self._chat(chat_id, user)
            except ChatNotFound:
                continue
            mine.add(chat_id)
        return mine
