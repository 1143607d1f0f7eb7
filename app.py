"""Reame's entry point: read reame.conf, build the parts, serve the page, the Gradio API and the
OpenAI-compatible API on one port. `python app.py adduser NAME` and friends manage accounts;
`install-service`, `backup DIR`, `restore DIR` and `pull REPO FILE` are for running it."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from pathlib import Path

# huggingface_hub (under Gradio, and `pull`) would otherwise ask its endpoint for things at
# its first request: nothing leaves this machine unless a user asks for a download.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from reame.accounts.cli import COMMANDS, give_ids, run_command
from reame.accounts.users import AccountError, Accounts
from reame.admin.live_settings import Settings
from reame.chats.service import ChatService
from reame.chats.store import DatabaseUnavailable
from reame.config.reame_conf import Config, ConfigError, load_config
from reame.runtime import build_service

log = logging.getLogger("reame")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "reame.conf"
SETTINGS = "settings"  # one settings change at a time (turns: the scheduler bounds them)


def build_app(config: Config, service: ChatService, accounts: Accounts | None):
    """One ASGI app: /v1 (OpenAI-compatible) and the Gradio page and API at /, behind the
    Guard (host names, origins, body sizes, cookies: reame/web/guard.py)."""
    # The web layer is imported here, when a server is built: Gradio alone takes 4-5 s to
    # import, which `adduser`, `pull`, `backup` and the other commands need not pay.
    import gradio as gr
    from fastapi import FastAPI

    from reame.web.guard import Guard
    from reame.web.health import build_health_router
    from reame.web.login import WebLogins
    from reame.web.metrics import CountRequests, Metrics, build_metrics_router
    from reame.web.named_api import register_api
    from reame.web.openai_api import build_router, internal_error
    from reame.web.page import build_page
    from reame.web.page_parts import CSS, PAGE_JS
    from reame.web.uploads import Uploads

    settings = Settings(config, service)
    can_configure = ((lambda user: accounts.is_admin(accounts.name_of(user)))
                     if accounts is not None else lambda user: True)
    max_upload = config.server.max_upload_bytes
    uploads = Uploads(max_bytes=max_upload)  # the page's uploads, each for its own session
    with gr.Blocks(title="Reame", analytics_enabled=False, fill_height=True) as demo:
        # The API first, so that its endpoint names stay exactly as documented.
        register_api(service, settings_group=SETTINGS, settings=settings,
                     can_configure=can_configure)
        build_page(demo, service, settings_group=SETTINGS, settings=settings, title="Reame",
                   can_configure=can_configure,
                   name_of=accounts.name_of if accounts is not None else lambda user: None,
                   uploads=uploads, unwatched_s=config.server.stalled_reply_s)
    demo.queue(default_concurrency_limit=8)
    app = FastAPI(title="Reame", docs_url=None, redoc_url=None, openapi_url=None)
    if accounts is not None:
        WebLogins(accounts).install(app)  # before Gradio's own /login is mounted

    app.include_router(build_router(service, accounts))
    app.include_router(build_health_router(service))  # no login: it tells only the state
    metrics = Metrics(service)
    app.include_router(build_metrics_router(metrics, accounts))  # admin or this machine
    # Unexpected errors: OpenAI's error shape, no traceback (uvicorn logs it).
    app.add_exception_handler(Exception, internal_error)
    app = gr.mount_gradio_app(
        app, demo, path="/", auth=accounts.check_password if accounts is not None else None,
        auth_message="Reame: log in with your user name and password.", css=CSS, js=PAGE_JS,
        # Only gr.Error messages reach clients; anything else is logged, not shown.
        show_error=False, ssr_mode=False, run_history=False,
        # Behind a proxy that serves it under a path: the page's own links and API calls.
        root_path=config.server.public_root or None,
        # Not Gradio's own "Settings" link: the page has a Settings tab of its own.
        footer_links=["api", "gradio"], max_file_size=max_upload)
    # Gradio checks the files an event names (only its upload folder) once it counts as
    # launched, which mount_gradio_app does not set: without it an event could name any file.
    demo.has_launched = True
    server = config.server
    guarded = Guard(uploads.wrap(app), allowed_hosts=server.allowed_host_names,
                    max_upload=max_upload, allowed_origins=server.allowed_origin_list)
    return CountRequests(guarded, metrics)  # the refused ones too


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
                    "not shown to anyone; give them to a user with `python app.py adopt NAME`",
                    ownerless, "" if ownerless == 1 else "s", "s" if ownerless == 1 else "")


def finish_writes_on_sigterm(service: ChatService) -> None:
    """On SIGTERM, end the process only once the KV files queued for writing are on disk.

    uvicorn stops on SIGTERM as on Ctrl-C, then raises the signal again for the handler it
    found at start: the default one would end the process before the files still being
    written in the background land (after Ctrl-C, the interpreter's exit waits for them)."""

    def end_after_writes(sig: int, _frame) -> None:
        if service.cache is not None:
            service.cache.flush()
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)

    signal.signal(signal.SIGTERM, end_after_writes)


def start_warm_up(service: ChatService) -> None:
    """Run the model and Gradio's first-call imports once while the server starts; /health
    says warming_up until it is done (reame/inference/warmup.py)."""
    from reame.inference.warmup import warm_up

    def warm() -> None:
        try:
            log.info("warmed up in %.2f s", warm_up(service))
        finally:
            service.warming = False

    service.warming = True  # before the server can answer /health
    threading.Thread(target=warm, name="warm-up", daemon=True).start()


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
    try:
        accounts = Accounts(config.users_path) if config.users_path else None
    except AccountError as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    problem = check_exposure(config, accounts)
    if problem:
        print(f"reame: {problem}", file=sys.stderr)
        return 2
    try:
        service = build_service(config)
    except DatabaseUnavailable as exc:  # a database server down, a wrong password
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    if accounts is not None:
        give_ids(accounts.assign_ids(), service.store)
        warn_of_ownerless_chats(service.store)
    app = build_app(config, service, accounts)

    import uvicorn

    log.info("Reame on http://%s:%d%s", config.server.host, config.server.port,
             " (accounts on)" if accounts is not None else "")
    finish_writes_on_sigterm(service)
    if config.server.warm_up:
        start_warm_up(service)
    # A proxy's X-Forwarded-For/-Proto (the client's address, https) only from the proxies
    # named: otherwise anyone could name any address (login limits) or claim https.
    proxies = config.server.trusted_proxies.replace(" ", "")
    # Connections limited per address and in all, with a deadline for each request's headers
    # (reame/web/connections.py); a proxy's clients are counted by the proxy.
    from reame.web.connections import limited_protocol

    uvicorn.run(app, host=config.server.host, port=config.server.port, log_level="warning",
                timeout_graceful_shutdown=5, proxy_headers=bool(proxies),
                forwarded_allow_ips=proxies or None,
                http=limited_protocol(exempt=frozenset(filter(None, proxies.split(",")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
