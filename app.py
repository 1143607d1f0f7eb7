"""Reame's entry point: read reame.conf, build the parts, launch the web app."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
from pathlib import Path

from reame.chat import ChatService
from reame.config import Config, ConfigError, load_config
from reame.runtime import build_service
from reame.settings import Settings
from reame.ui import CSS, build_ui

log = logging.getLogger("reame")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "reame.conf"


def build_app(config: Config, service: ChatService):
    """The Gradio Blocks with the UI and the API endpoints."""
    return build_ui(service, settings=Settings(config, service), title="Reame")


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
    # Stop on SIGTERM as on Ctrl-C: Gradio closes, and the KV files still being written in
    # the background are finished (an atexit flush) before the process ends.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    demo.launch(server_name=config.server.host, server_port=config.server.port,
                show_error=True, inbrowser=False, css=CSS, run_history=False, ssr_mode=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
