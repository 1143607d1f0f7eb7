"""The server: one ASGI app of the page, the Gradio API and /v1 (build_app), served by uvicorn
(serve). app.py composes the parts and calls these; the other commands of app.py never import
this module, and so never pay for Gradio's import (4-5 s)."""

from __future__ import annotations

import logging
import signal

import gradio as gr
import uvicorn
from fastapi import FastAPI

from reame.accounts.live import LiveAccounts
from reame.accounts.users import Accounts
from reame.admin.live_settings import Settings
from reame.chats.service import ChatService
from reame.config.reame_conf import Config
from reame.inference.warmup import settle_objects
from reame.web.gradio_api.named_api import register_api
from reame.web.http.connections import limited_protocol
from reame.web.http.guard import Guard
from reame.web.http.health import build_health_router
from reame.web.http.login import WebLogins
from reame.web.http.metrics import CountRequests, Metrics, build_metrics_router
from reame.web.http.queue_polling import poll_gently
from reame.web.http.uploads import Uploads
from reame.web.page.layout import build_page
from reame.web.page.parts import CSS, PAGE_JS
from reame.web.page.users_panel import USERS_CSS, UsersPanel
from reame.web.v1.common import internal_error
from reame.web.v1.router import build_router

log = logging.getLogger("reame")
SETTINGS_GROUP = "settings"  # one settings change at a time (turns: the scheduler bounds them)


def build_app(config: Config, service: ChatService, accounts: Accounts | None):
    """One ASGI app: /v1 (OpenAI-compatible) and the Gradio page and API at /, behind the
    Guard (host names, origins, body sizes, cookies: reame/web/http/guard.py). Without accounts,
    the page's Users tab can turn them on (live: every part reads them at each request)."""
    settings = Settings(config, service)
    live = LiveAccounts(accounts, config.path)
    can_configure = live.can_configure
    max_upload = config.server.max_upload_bytes
    uploads = Uploads(max_bytes=max_upload)  # the page's uploads, each for its own session
    with gr.Blocks(title="Reame", analytics_enabled=False, fill_height=True) as demo:
        # The API first, so that its endpoint names stay exactly as documented.
        register_api(service, settings_group=SETTINGS_GROUP, settings=settings,
                     can_configure=can_configure)
        build_page(demo, service, settings_group=SETTINGS_GROUP, settings=settings, title="Reame",
                   can_configure=can_configure,
                   name_of=live.name_of, uploads=uploads,
                   unwatched_s=config.server.stalled_reply_s, users=UsersPanel(live, service))
    demo.queue(default_concurrency_limit=8)
    poll_gently(demo._queue)  # not Gradio's 1 ms polling: it takes from the decodes
    app = FastAPI(title="Reame", docs_url=None, redoc_url=None, openapi_url=None)
    WebLogins(live).install(app)  # before Gradio's own /login is mounted

    app.include_router(build_router(service, live))
    app.include_router(build_health_router(service))  # no login: it tells only the state
    metrics = Metrics(service)
    app.include_router(build_metrics_router(metrics, live))  # admin or this machine
    # Unexpected errors: OpenAI's error shape, no traceback (uvicorn logs it).
    app.add_exception_handler(Exception, internal_error)
    app = gr.mount_gradio_app(
        app, demo, path="/", auth=accounts.check_password if accounts is not None else None,
        auth_message="Reame: log in with your user name and password.", css=CSS + USERS_CSS,
        js=PAGE_JS,
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


def serve(config: Config, service: ChatService, accounts: Accounts | None) -> None:
    """Serve build_app's app until SIGTERM or Ctrl-C (the model's warm-up, if asked, may still
    be running: /health says so)."""
    app = build_app(config, service, accounts)
    log.info("Reame on http://%s:%d%s", config.server.host, config.server.port,
             " (accounts on)" if accounts is not None else "")
    finish_writes_on_sigterm(service)
    settle_objects()  # the collector, off while the app started, on from here
    # A proxy's X-Forwarded-For/-Proto (the client's address, https) only from the proxies
    # named: otherwise anyone could name any address (login limits) or claim https.
    proxies = config.server.trusted_proxies.replace(" ", "")
    # Connections limited per address and in all, with a deadline for each request's headers
    # (reame/web/http/connections.py); a proxy's clients are counted by the proxy.
    uvicorn.run(app, host=config.server.host, port=config.server.port, log_level="warning",
                timeout_graceful_shutdown=5, proxy_headers=bool(proxies),
                forwarded_allow_ips=proxies or None,
                http=limited_protocol(exempt=frozenset(filter(None, proxies.split(",")))))
