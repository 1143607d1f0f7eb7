"""Reame's entry point: read reame.conf, build the parts, serve the page, the Gradio API and the
OpenAI-compatible API on one port. `python app.py adduser NAME` and friends manage accounts;
`install-service`, `backup DIR`, `restore DIR` and `pull REPO FILE` are for running it."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# huggingface_hub (under Gradio, and `pull`) would otherwise ask its endpoint for things at
# its first request: nothing leaves this machine unless a user asks for a download.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# Only what every command needs is imported here: the server's parts (SQLAlchemy, the model,
# Gradio) are imported by main when it serves, so that `adduser` or `pull` start at once.
from reame.accounts.cli import COMMANDS, run_command
from reame.config.reame_conf import Config, ConfigError, load_config

if TYPE_CHECKING:
    from reame.accounts.users import Accounts

log = logging.getLogger("reame")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "reame.conf"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="reame.conf to read (default: %(default)s)")
    parser.add_argument("--model", type=Path,
                        help="model file for this run, instead of the config's")
    parser.add_argument("--port", type=int, help="port for this run, instead of the config's")
    return parser.parse_args(argv)


def check_exposure(config: Config, accounts: Accounts | None) -> str | None:
    """Why the app must not start as configured, or None."""
    server = config.server
    if accounts is not None and not accounts.names():
        return (f"[server] users_file is {accounts.path}, which has no users: nobody could log "
                f"in. Add one with `python app.py adduser NAME`.")
    if accounts is None and not server.local_only and not server.allow_anonymous:
        return (f"refusing to listen on {server.host} without accounts: anyone who reaches "
                f"the port could read and delete every chat. Set [server] users_file and add a "
                f"user (`python app.py adduser NAME`), or set allow_anonymous = true if "
                f"something else guards the port.")
    return None


def warn_of_ownerless_chats(store) -> None:
    """Chats made before accounts were turned on belong to nobody: nobody can see them."""
    ownerless = store.count_chats(None)
    if ownerless:
        log.warning("%d chat%s made before accounts were turned on belong%s to nobody and are "
                    "not shown to anyone; an admin who logs in is offered to adopt them, or "
                    "give them to a user with `python app.py adopt NAME`",
                    ownerless, "" if ownerless == 1 else "s", "s" if ownerless == 1 else "")


def _install_service(argv: list[str]) -> int:
    from reame.admin import service_unit

    return service_unit.run(argv, DEFAULT_CONFIG)


def _backup(argv: list[str]) -> int:
    from reame.admin.backup import run_backup

    return run_backup(argv, DEFAULT_CONFIG)


def _restore(argv: list[str]) -> int:
    from reame.admin.backup import run_restore

    return run_restore(argv, DEFAULT_CONFIG)


def _pull(argv: list[str]) -> int:
    from reame.models.pull import run_pull

    return run_pull(argv, DEFAULT_CONFIG)


# Commands for running Reame (each imports only what it needs: no model, no Gradio).
OPERATIONS = {"install-service": _install_service, "backup": _backup, "restore": _restore,
              "pull": _pull}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv and argv[0] in COMMANDS:
        return run_command(argv, DEFAULT_CONFIG)
    if argv and argv[0] in OPERATIONS:
        return OPERATIONS[argv[0]](argv[1:])
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
    return _serve(config)


def _serve(config: Config) -> int:
    # Starting makes millions of objects and no garbage: the collector stays off until the
    # app is built (reame/inference/warmup.py settle_objects; the imports run 0.3 s faster).
    gc.disable()
    from reame.accounts.cli import give_ids
    from reame.accounts.users import AccountError, Accounts
    from reame.chats.store import DatabaseUnavailable
    from reame.runtime import build_service_soon

    try:
        accounts = Accounts(config.users_path) if config.users_path else None
    except AccountError as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    problem = check_exposure(config, accounts)
    if problem:
        print(f"reame: {problem}", file=sys.stderr)
        return 2
    # The model loads and warms up in llama.cpp while Gradio is imported here. The thread
    # starts after this module's imports above, and imports nothing Gradio does.
    building = build_service_soon(config, warm_up=config.server.warm_up)
    from reame.web.server import serve

    try:
        service = building.result()
    except DatabaseUnavailable as exc:  # a database server down, a wrong password
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    if accounts is not None:
        give_ids(accounts.assign_ids(), service.store)
        warn_of_ownerless_chats(service.store)
    serve(config, service, accounts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
