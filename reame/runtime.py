"""Build the running parts: the store, the engine and its KV cache, the service.

build_service makes them from a Config (the app); service_over makes them over a folder with an
engine already loaded (tests and the benchmark): one way to assemble the service either way.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from reame.chats.service import ChatService
from reame.chats.store import Store
from reame.config.chat_settings import ChatSettings
from reame.config.reame_conf import DATABASE_FILE, Config
from reame.inference.engine import Engine
from reame.inference.loading import build_cache, model_runtime
from reame.inference.model_runtime import ModelRuntime
from reame.inference.tasks import Limits
from reame.inference.warmup import warm_model
from reame.models.model_file import ModelLoadError

log = logging.getLogger(__name__)


def load_runtime(config: Config, store: Store, limits: Limits,
                 threads: int | None = None) -> ModelRuntime:
    """model_runtime, in this process or, with [model] engine_process, in a process of its
    own (reame/inference/remote/parent.py: a crash of llama.cpp ends turns, not the server)."""
    if config.model.engine_process:
        from reame.inference.remote.parent import RemoteRuntime

        return RemoteRuntime(model_runtime, (config, store.chat_ids(), limits, threads),
                             limits)
    return model_runtime(config, store.chat_ids(), limits, threads)


def build_service(config: Config, *, threads: int | None = None) -> ChatService:
    """Everything a chat needs. A model that cannot load leaves the service up, saying why.
    threads: the engine decodes with so many threads until engine.set_threads() (the
    shared opening it computes here included)."""
    store = Store(config.storage.database)  # the SQLite file, or the server nodes share
    log.info("chats in %s", store.where)
    server = config.server
    limits = {"max_chats": config.storage.max_chats_per_user,
              "limits": Limits(max_waiting=server.max_waiting, stall_s=server.stalled_reply_s,
                               share=server.user_share)}
    try:
        runtime = load_runtime(config, store, limits["limits"], threads)
    except ModelLoadError as exc:
        log.error("%s", exc)
        return ChatService(store, None, config.generation, load_error=str(exc), **limits)
    service = ChatService(store, None, config.generation, runtime=runtime,
                          model_titles=server.model_titles, **limits)
    service.reload_after_a_crash(lambda: load_runtime(config, store, limits["limits"]))
    service.share_default_prompt()
    return service


def build_service_soon(config: Config, *, warm_up: bool) -> Future[ChatService]:
    """build_service on a thread of its own, then (warm_up) the model's warm-up: the model
    loads and runs in llama.cpp, off the GIL, while the caller imports and builds the web layer
    (Gradio's import alone is over 2 s). Meanwhile the engine decodes on one thread: the other
    core is the caller's (measured: the warm-up then takes 0.3 s instead of 1.4 s, and the
    server is ready 0.1 s sooner). The future holds the service as soon as it is built, or
    what building it raised; service.warming is True until its warm-up is done."""
    built: Future[ChatService] = Future()

    def run() -> None:
        try:
            service = build_service(config, threads=1)
        except BaseException as exc:  # the caller raises it
            built.set_exception(exc)
            return
        service.warming = warm_up  # before anyone can ask /health
        built.set_result(service)
        try:
            if warm_up:
                log.info("model warmed up in %.2f s", warm_model(service))
        finally:
            runtime = service.runtime
            if runtime is not None:
                runtime.engine.set_threads()
            service.warming = False

    threading.Thread(target=run, name="start", daemon=True).start()
    return built


def service_over(folder: Path, engine: Engine, defaults: ChatSettings, *, cache: bool = True,
                 max_disk_bytes: int = 1 << 30, kv_dir: Path | None = None,
                 **limits) -> ChatService:
    """A service over folder (reame.db, and the KV files in kv_dir or folder/kv unless cache
    is off) with an engine already loaded; limits: Limits' fields (max_waiting, stall_s,
    share), reame.conf's defaults otherwise."""
    kv = (kv_dir or folder / "kv") if cache else None
    return ChatService(Store(folder / DATABASE_FILE), engine, defaults,
                       cache=build_cache(engine, kv, max_disk_bytes),
                       limits=Limits(**limits))
