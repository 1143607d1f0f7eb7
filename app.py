"""Reame's entry point: read reame.conf, build the parts, launch the web app."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from reame.cache import KVCache
from reame.chat import ChatService
from reame.config import Config, ConfigError, load_config
from reame.engine import Engine, ModelLoadError
from reame.kvstore import KVStore
from reame.store import Store
from reame.ui import CSS, build_ui

log = logging.getLogger("reame")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "reame.conf"


def build_service(config: Config) -> ChatService:
    """The store, the engine and the KV cache; a model that cannot load leaves the app up
    with the reason shown in the page."""
    store = Store(config.storage.database_path)
    engine, load_error = None, None
    try:
        engine = Engine(config.model.model_path, n_ctx=config.model.n_ctx,
                        n_threads=config.model.n_threads, kv_type=config.cache.kv_type,
                        models_dir=config.base_dir / "models")
    except ModelLoadError as exc:
        load_error = str(exc)
        log.error("%s", load_error)
    cache = None
    if engine is not None:
        cache = KVCache(engine, build_kvstore(config, engine, store))
    return ChatService(store, engine, config.generation, cache=cache, load_error=load_error)


def build_kvstore(config: Config, engine: Engine, store: Store) -> KVStore | None:
    if not config.cache.enabled:
        return None
    kv = KVStore(config.cache.dir, fingerprint=engine.kv_fingerprint,
                 max_bytes=config.cache.max_disk_mb * 1024 * 1024)
    swept = kv.sweep(store.chat_ids())
    if swept:
        log.info("deleted %d KV files of chats that no longer exist", swept)
    return kv


def build_app(config: Config, service: ChatService):
    """The Gradio Blocks with the UI and the API endpoints."""
    return build_ui(service, title="Reame")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="reame.conf to read (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="model file for this run, instead of the config's")
    parser.add_argument("--port", type=int, help="port for this run, instead of the config's")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    if args.model:
        config = dataclasses.replace(
            config, model=dataclasses.replace(config.model, model_path=args.model.resolve()))
    if args.port:
        config = dataclasses.replace(
            config, server=dataclasses.replace(config.server, port=args.port))
    service = build_service(config)
    demo = build_app(config, service)
    demo.queue(default_concurrency_limit=8)
    demo.launch(server_name=config.server.host, server_port=config.server.port,
                show_error=True, inbrowser=False, css=CSS, run_history=False, ssr_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
