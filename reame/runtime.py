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
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.kv.blobs import open_blobs
from reame.inference.kv.kvstore import KVStore
from reame.inference.model_runtime import ModelRuntime
from reame.inference.tasks import Limits
from reame.inference.warmup import warm_model
from reame.models.model_file import ModelLoadError

log = logging.getLogger(__name__)


def build_engine(config: Config) -> Engine:
    """Load the configured model; ModelLoadError says why it cannot be."""
    model = config.model
    return Engine(model.model_path, n_ctx=model.n_ctx, n_threads=model.n_threads,
                  kv_type=config.cache.kv_type, models_dir=config.model.models_dir,
                  slots=model.slots, kv_budget_bytes=model.kv_ram_bytes,
                  exact_under_load=model.exact_under_load, exact_reuse=config.cache.exact,
                  mmap=model.mmap,
                  flash_attn=model.flash_attn)


def build_cache(engine: Engine, kv_dir: Path | None, max_bytes: int,
                store: Store | None = None, chat_ids: set[int] | None = None) -> KVCache:
    """The engine's KV cache: files in the blobs of kv_dir (blobs.open_blobs: the folder;
    None: only the live context is reused). With the store, the files of chats that no longer
    exist are deleted first."""
    if kv_dir is None:
        return KVCache(engine, None)
    files = KVStore(open_blobs(kv_dir), fingerprint=engine.kv_fingerprint, max_bytes=max_bytes)
    if store is not None:
        chat_ids = store.chat_ids()
    swept = files.sweep(chat_ids) if chat_ids is not None else 0
    if swept:
        log.info("deleted %d KV files of chats that no longer exist", swept)
    return KVCache(engine, files)


def config_cache(config: Config, engine: Engine, store: Store | None,
                 chat_ids: set[int] | None = None) -> KVCache:
    """The KV cache reame.conf asks for (the files of chats not in the store, or not among
    chat_ids, deleted first)."""
    cache = config.cache
    return build_cache(engine, cache.dir if cache.enabled else None, cache.max_disk_bytes,
                       store, chat_ids)


def model_runtime(config: Config, chat_ids: set[int] | None, limits: Limits,
                  threads: int | None = None) -> ModelRuntime:
    """The model reame.conf names, loaded in this process with its KV cache (ModelLoadError
    says why it cannot be); threads: as build_service's."""
    engine = build_engine(config)
    if threads:
        engine.set_threads(threads)
    return ModelRuntime(engine, config_cache(config, engine, None, chat_ids), limits)


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
    service = ChatService(store, None, config.generation, runtime=runtime, **limits)
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
