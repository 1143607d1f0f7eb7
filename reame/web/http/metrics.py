"""GET /metrics: how the server is doing, in Prometheus' text format (prometheus_client).

Turns, their prompt tokens (evaluated, or reused from the live KV or from files: the time the
cache saves), first-token and per-token latency, cache hits by source and misses, the KV files
on disk, evictions and rejected files, the line of waiting turns, the model's load time, and
HTTP requests by API. Counters of turns are kept here (the service tells of every turn); the
rest is read from the service when scraped.

Who may read it: anyone when there are no accounts (the server then listens on this machine
only, or something else guards it); with accounts, an admin's API key, or a request from this
machine that no proxy forwarded (a reverse proxy on the same machine connects from loopback
too: its forwarding headers tell it apart, so a proxy must send them, as nginx's
`proxy_set_header X-Forwarded-For` does).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from reame.accounts.live import LiveAccounts
from reame.accounts.users import Accounts
from reame.chats.service import ChatService
from reame.config.reame_conf import LOOPBACK_NAMES
from reame.inference.cache_state import FROM_FILES
from reame.inference.decoding import Decoding
from reame.inference.turn import TurnStats
from reame.web.http.app_path import app_path

log = logging.getLogger(__name__)

FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


class Metrics:
    """The server's metrics: one registry per app (several apps may share a process)."""

    def __init__(self, service: ChatService):
        self.registry = registry = CollectorRegistry()
        self.turns = Counter("reame_turns", "Turns answered, by kind (chat: a stored chat's; "
                             "stateless: /v1 without a chat) and outcome (done / stopped)",
                             ["kind", "outcome"], registry=registry)
        self.prompt_tokens = Counter(
            "reame_prompt_tokens", "Prompt tokens by how their KV came: evaluated (computed "
            "now or while typed), restored (from a KV file), live (kept in memory)", ["how"],
            registry=registry)
        self.hits = Counter("reame_cache_hits", "Turns that reused KV, by where it came from "
                            "(live, disk, branch, prefix)", ["source"], registry=registry)
        self.misses = Counter("reame_cache_misses", "Turns that reused no KV at all",
                              registry=registry)
        self.first_token = Histogram(
            "reame_first_token_seconds", "From a turn's start on its slot to its first token",
            buckets=FIRST_TOKEN_BUCKETS, registry=registry)
        self.token = Histogram(
            "reame_token_seconds", "Between two tokens of a reply (other slots' steps "
            "included, as the reader sees it)", buckets=TOKEN_BUCKETS, registry=registry)
        self.requests = Counter("reame_http_requests", "HTTP requests by API (v1, gradio_api, "
                                "page, health, metrics) and status class", ["api", "code"],
                                registry=registry)
        registry.register(ServiceCollector(service))
        service.observe_turn = self.observe_turn

    def observe_turn(self, stats: TurnStats, decoding: Decoding | None, stored: bool) -> None:
        self.turns.labels("chat" if stored else "stateless",
                          "stopped" if stats.stopped else "done").inc()
        reused = max(0, stats.reused - stats.typed_ahead)
        how = "restored" if stats.source in FROM_FILES else "live"
        self.prompt_tokens.labels("evaluated").inc(stats.prefilled + stats.typed_ahead)
        self.prompt_tokens.labels(how).inc(reused)
        if stats.reused and stats.source != "none":
            self.hits.labels(stats.source).inc()
        else:
            self.misses.inc()
        if decoding is None:  # stopped mid-prompt
            return
        if decoding.first_at is not None:
            self.first_token.observe(stats.first_token_s)
        times = decoding.token_times
        for before, after in zip(times, times[1:]):
            self.token.observe(after - before)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class ServiceCollector:
    """What the service knows when scraped: the cache's files and figures, the line, the
    model."""

    def __init__(self, service: ChatService):
        self.service = service

    def describe(self):
        return []  # read at scrape time only: no scrape while registering

    def collect(self):
        service = self.service
        engine, cache, scheduler = service.engine, service.cache, service.scheduler
        yield _gauge("reame_model_loaded", "1 while a model is loaded", engine is not None)
        yield _gauge("reame_model_loading", "1 while a model is being checked or loaded",
                     service.loading)
        yield _gauge("reame_model_load_seconds", "How long loading the current model took",
                     engine.load_s if engine is not None else 0.0)
        active, waiting = scheduler.load() if scheduler is not None else (0, 0)
        yield _gauge("reame_turns_active", "Turns on a slot now", active)
        yield _gauge("reame_turns_waiting", "Turns waiting for a free slot", waiting)
        yield _gauge("reame_slots", "Replies that can be written at once",
                     len(engine.sequences) if engine is not None else 0)
        if cache is None:
            return
        stats = cache.stats()
        yield _gauge("reame_prefill_tokens_per_second", "Prompt evaluation speed, measured",
                     stats["prefill_tokens_per_s"])
        yield _gauge("reame_recompute_seconds_saved", "Evaluation time the restored tokens "
                     "saved, since the cache's figures began (they outlive restarts)",
                     stats["time_saved_s"])
        if not cache.enabled:
            return
        yield _gauge("reame_kv_files", "KV files on disk", stats["files"])
        yield _gauge("reame_kv_disk_bytes", "Bytes of KV files on disk", stats["disk_bytes"])
        yield _gauge("reame_kv_disk_budget_bytes", "The KV files' disk budget",
                     stats["max_disk_bytes"])
        counters = stats["counters"]
        for name, key, text in (
                ("reame_kv_evictions", "evicted", "KV files deleted to stay in the budget"),
                ("reame_kv_rejected_files", "rejected", "KV files found unusable (corrupt, "
                 "another model's, an old format): each a cache miss"),
                ("reame_kv_writes", "writes", "KV files written"),
                ("reame_kv_write_errors", "write_errors", "KV files that could not be written")):
            yield CounterMetricFamily(name, text + " (since the model was loaded)",
                                      value=counters[key])


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=float(value))


def may_read(request: Request, accounts: Accounts | None) -> bool:
    """Without accounts anyone; with them an admin's key or an unforwarded local request."""
    if accounts is None:
        return True
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return accounts.is_admin(accounts.user_for_key(key.strip()))
    client = request.client.host if request.client else ""
    return client in LOOPBACK_NAMES and not any(h in request.headers for h in FORWARDING_HEADERS)


def build_metrics_router(metrics: Metrics, live: LiveAccounts) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics")
    def read_metrics(request: Request) -> Response:
        if not may_read(request, live.current):
            return JSONResponse({"error": "metrics are for an admin's API key or this "
                                          "machine"}, status_code=403)
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return router


class CountRequests:
    """ASGI middleware: counts HTTP requests by API and status class."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        api = api_of(scope.get("path", ""), scope.get("root_path", ""))

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(api, f"{message['status'] // 100}xx").inc()
            await send(message)

        return await self.app(scope, receive, counting_send)


def api_of(path: str, root_path: str = "") -> str:
    """Which API a request path is for (a few values: a label of bounded size)."""
    path = app_path(path, root_path)
    for prefix, api in (("/v1/", "v1"), ("/gradio_api/", "gradio_api"),
                        ("/health", "health"), ("/metrics", "metrics")):
        if path.startswith(prefix):
            return api
    return "page"
