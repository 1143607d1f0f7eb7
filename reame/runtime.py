"""Build the running parts from a Config: the store, the engine and its KV cache, the service."""

from __future__ import annotations

import logging

from .cache import KVCache
from .chat import ChatService
from .config import Config
from .engine import Engine
from .model_file import ModelLoadError
from .kvstore import KVStore
from .store import Store

log = logging.getLogger(__name__)


def build_engine(config: Config) -> Engine:
    """Load the configured model; ModelLoadError says why it cannot be."""
    return Engine(config.model.model_path, n_ctx=config.model.n_ctx,
                  n_threads=config.model.n_threads, kv_type=config.cache.kv_type,
                  models_dir=config.base_dir / "models")


def build_cache(config: Config, engine: Engine, store: Store) -> KVCache:
    """The engine's KV cache: files on disk when enabled, else only the live context."""
    if not config.cache.enabled:
        return KVCache(engine, None)
    kv = KVStore(config.cache.dir, fingerprint=engine.kv_fingerprint,
                 max_bytes=config.cache.max_disk_mb * 1024 * 1024)
    swept = kv.sweep(store.chat_ids())
    if swept:
        log.info("deleted %d KV files of chats that no longer exist", swept)
    return KVCache(engine, kv)


def build_service(config: Config) -> ChatService:
    """Everything a chat needs. A model that cannot load leaves the service up, saying why."""
    store = Store(config.storage.database_path)
    try:
        engine = build_engine(config)
    except ModelLoadError as exc:
        log.error("%s", exc)
        return ChatService(store, None, config.generation, load_error=str(exc),
                           max_chats=config.storage.max_chats_per_user)
    service = ChatService(store, engine, config.generation,
                          cache=build_cache(config, engine, store),
                          max_chats=config.storage.max_chats_per_user)
    service.share_default_prompt()
    return service
