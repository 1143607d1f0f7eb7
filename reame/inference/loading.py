"""Load the model reame.conf names, with its KV cache: in the server's process (reame.runtime)
or in the engine's own (remote/child.py builds it with model_runtime, importing no more than
the inference layer).
"""

from __future__ import annotations

import logging
from pathlib import Path

from reame.config.reame_conf import Config
from reame.inference.cache import KVCache
from reame.inference.engine import Engine
from reame.inference.kv.blobs import open_blobs
from reame.inference.kv.kvstore import KVStore
from reame.inference.model_runtime import ModelRuntime
from reame.inference.tasks import Limits

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
                chat_ids: set[int] | None = None) -> KVCache:
    """The engine's KV cache: files in the blobs of kv_dir (blobs.open_blobs: the folder;
    None: only the live context is reused). With chat_ids (the store's), the files of chats
    that no longer exist are deleted first."""
    if kv_dir is None:
        return KVCache(engine, None)
    files = KVStore(open_blobs(kv_dir), fingerprint=engine.kv_fingerprint, max_bytes=max_bytes)
    swept = files.sweep(chat_ids) if chat_ids is not None else 0
    if swept:
        log.info("deleted %d KV files of chats that no longer exist", swept)
    return KVCache(engine, files)


def config_cache(config: Config, engine: Engine, chat_ids: set[int] | None) -> KVCache:
    """The KV cache reame.conf asks for (the files of chats not among chat_ids deleted
    first)."""
    cache = config.cache
    return build_cache(engine, cache.dir if cache.enabled else None, cache.max_disk_bytes,
                       chat_ids)


def model_runtime(config: Config, chat_ids: set[int] | None, limits: Limits,
                  threads: int | None = None) -> ModelRuntime:
    """The model reame.conf names, loaded in this process with its KV cache (ModelLoadError
    says why it cannot be); threads: as build_service's."""
    engine = build_engine(config)
    if threads:
        engine.set_threads(threads)
    return ModelRuntime(engine, config_cache(config, engine, chat_ids), limits)
