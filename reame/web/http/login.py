"""Web logins, replacing Gradio's /login route: the same form and cookies, but

- the password check (scrypt, about 50 ms of CPU) runs off the event loop, two at a time at
  most, and costs the same for unknown names (Accounts.check_password);
- failures are limited per address (the client's: a proxy's X-Forwarded-For is believed only
  from `[server] trusted_proxies`), and spaced per name by a growing delay that a browser which
  logged in as that name before skips (429 with Retry-After): nobody can lock a person out;
- the login cookie is Secure when the request came over HTTPS (directly, or by
  X-Forwarded-Proto from a trusted proxy);
- the session holds the user's stable id, not the name (a new user given a deleted user's
  name gets none of the old one's chats), and ends as soon as the account changes: a new
  password, a revoked key, or the user deleted (`python app.py passwd/revokekey/deluser`,
  even while the server runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import threading
import time
from collections import defaultdict, deque
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from reame.accounts.live import LiveAccounts
from reame.accounts.users import Accounts
from reame.web.http.app_path import app_path

MAX_FAILURES = 10  # failed logins per address within FAILURE_WINDOW_S; then it waits
FAILURE_WINDOW_S = 600
# One name's failures (from any address): past NAME_FREE_FAILURES within the window, its next
# attempt waits 2, 4, 8, ... s after the last failure, at most NAME_MAX_DELAY_S. A browser that
# logged in as that name before (DEVICE_COOKIE) does not wait: guessing alice's password from
# many addresses is slowed down, and alice is not locked out by it.
NAME_FREE_FAILURES = 5
NAME_MAX_DELAY_S = 60
DEVICE_COOKIE = "reame-device"
DEVICE_DAYS = 90
CONCURRENT_CHECKS = 2  # password checks running at once (each takes a core for ~50 ms)
# When the page turns accounts on, Gradio's own login check starts this long after: the page
# reads its answer from an event stream it may open only after its request ran, and Gradio's
# check would refuse that stream (then the page reloads to the login without the answer: 1
# run in about 9 of test_page_users). Meanwhile Reame's check refuses every request to Gradio
# without a login but that stream.
ANSWER_WINDOW_S = 5.0

# The page at / before a login: Reame's own, light or dark as the system is. A failed attempt
# says why and keeps the name typed (the form is sent by fetch, the page stays).
LOGIN_PAGE = (Path(__file__).parent / "login.html").read_text(encoding="utf-8")


class FailedLogins:
    """Recent failures per key (an address, a name); too many: wait."""

    def __init__(self, limit: int = MAX_FAILURES, window_s: float = FAILURE_WINDOW_S):
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def retry_after(self, *keys: str) -> int:
        """Seconds until another attempt is allowed for all of keys (0: now)."""
        now = time.monotonic()
        wait = 0.0
        with self._lock:
            for key in keys:
                times = self._failures.get(key)
                if not times:
                    continue
                while times and times[0] <= now - self.window_s:
                    times.popleft()
                if len(times) >= self.limit:
                    wait = max(wait, times[0] + self.window_s - now)
                if not times:
                    del self._failures[key]
        return int(wait) + 1 if wait else 0

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._failures[key].append(now)


class NameDelays:
    """Recent failures per user name, and how long its next attempt must wait."""

    def __init__(self, free: int = NAME_FREE_FAILURES, max_delay_s: float = NAME_MAX_DELAY_S,
                 window_s: float = FAILURE_WINDOW_S):
        self.free, self.max_delay_s, self.window_s = free, max_delay_s, window_s
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def retry_after(self, name: str) -> int:
        now = time.monotonic()
        with self._lock:
            times = self._failures.get(name)
            if not times:
                return 0
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._failures[name]
                return 0
            over = len(times) - self.free
            if over < 0:
                return 0
            wait = times[-1] + min(2.0 ** (over + 1), self.max_delay_s) - now
        return int(wait) + 1 if wait > 0 else 0

    def failed(self, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._failures[name].append(now)
            if len(self._failures) > 10_000:  # guesses at many names: forget the old ones
                for old in [n for n, t in self._failures.items() if t[-1] <= now - self.window_s]:
                    del self._failures[old]


class WebLogins:
    """The logins of the page (and of gradio_client), kept in Gradio's token table."""

    def __init__(self, live: LiveAccounts):
        self.live = live
        self.failures = FailedLogins()  # per address
        self.name_delays = NameDelays()
        self._device_key = secrets.token_bytes(32)  # device cookies of this process
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)
        self._stamps: dict[str, tuple[str, tuple]] = {}  # token -> (name, stamp at login)
        self._lock = threading.Lock()
        self._seen = -1  # the accounts' version last checked
        # The Gradio session of the page that turned accounts on, while its answer may be
        # on its way (ANSWER_WINDOW_S); None otherwise.
        self._answering: str | None = None

    def install(self, app: FastAPI) -> None:
        """Add the /login route and the check that ends changed accounts' sessions; call it
        before Gradio is mounted (the first matching route answers). Both do nothing while
        the server has no accounts; once they are turned on (the page's first admin),
        Gradio's own check asks for a login too."""
        self.live.when_turned_on(
            lambda accounts, page: self._turned_on(_gradio(app), accounts, page))

        @app.post("/login")
        @app.post("/login/")
        async def login(request: Request):
            if self.accounts is None:
                return JSONResponse({"detail": "This server has no accounts."}, status_code=400)
            return await self._login(request, _gradio(app))

        # Plain ASGI, not @app.middleware("http"): Starlette's BaseHTTPMiddleware passes each
        # chunk of a streamed answer through a memory stream and a task of its own, which
        # cost the event loop about a quarter of its work per token of a /v1 stream
        # (profiled), on the cores that llama.cpp's threads decode on.
        login = self

        class EndChangedSessions:
            def __init__(self, inner: ASGIApp):
                self.inner = inner

            async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
                if scope["type"] != "http" or login.accounts is None:
                    return await self.inner(scope, receive, send)
                request = Request(scope)
                gradio = _gradio(app)
                login.prune(gradio)
                if (request.method == "GET" and request.url.path.rstrip("/") == ""
                        and not _logged_in(request, gradio)):
                    # Not Gradio's login page: ours keeps the name typed.
                    return await HTMLResponse(LOGIN_PAGE)(scope, receive, send)
                answering = login._answering
                if (answering is not None and _to_gradio(request)
                        and not _answer_stream(request, answering)
                        and not _logged_in(request, gradio)):
                    return await JSONResponse({"detail": "Not authenticated"}, status_code=401)(
                        scope, receive, send)
                await self.inner(scope, receive, send)

        app.add_middleware(EndChangedSessions)

    @property
    def accounts(self) -> Accounts | None:
        return self.live.current

    def _turned_on(self, gradio, accounts: Accounts, page: str | None) -> None:
        """Accounts were just turned on (by page, a Gradio session, if not None): Gradio's
        own login check is set, after ANSWER_WINDOW_S if a page is still to read its answer."""
        def check_logins() -> None:
            gradio.auth = accounts.check_password
            self._answering = None

        if page is None:
            check_logins()
            return
        self._answering = page
        timer = threading.Timer(ANSWER_WINDOW_S, check_logins)
        timer.daemon = True
        timer.start()

    async def _login(self, request: Request, gradio) -> JSONResponse:
        form = await request.form()
        name = str(form.get("username", "")).strip()[:256]
        password = str(form.get("password", ""))[:1024]
        # The client's address: uvicorn takes it from X-Forwarded-For only when the request
        # comes from one of [server] trusted_proxies.
        address = f"address:{request.client.host if request.client else '?'}"
        known_device = hmac.compare_digest(request.cookies.get(DEVICE_COOKIE, ""),
                                           self._device(name))
        wait = max(self.failures.retry_after(address),
                   0 if known_device else self.name_delays.retry_after(name))
        if wait:
            return JSONResponse({"detail": f"Too many failed logins: try again in {wait} s."},
                                status_code=429, headers={"Retry-After": str(wait)})
        async with self._checks:
            ok = await run_in_threadpool(self.accounts.check_password, name, password)
        user_id = self.accounts.user_id(name) if ok else None
        if user_id is None:
            self.failures.failed(address)
            self.name_delays.failed(name)
            return JSONResponse({"detail": "Incorrect credentials."}, status_code=400)
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._stamps[token] = (name, self.accounts.session_stamp(name))
            gradio.tokens[token] = user_id
        response = JSONResponse({"success": True})
        # Gradio's cookie names (its pages and API read either); SameSite=Lax (guard.py).
        # Over HTTPS only the Secure one: a cookie without it would also go out over plain
        # HTTP to this host.
        https = request.url.scheme == "https"
        response.set_cookie(f"access-token-{gradio.cookie_id}", token, httponly=True,
                            samesite="lax", secure=True)
        if not https:
            response.set_cookie(f"access-token-unsecure-{gradio.cookie_id}", token,
                                httponly=True, samesite="lax")
        response.set_cookie(DEVICE_COOKIE, self._device(name), httponly=True, samesite="lax",
                            secure=https, max_age=DEVICE_DAYS * 86400)
        return response

    def _device(self, name: str) -> str:
        """The device cookie of a browser that logged in as name (in this process)."""
        return hmac.new(self._device_key, name.encode(), hashlib.sha256).hexdigest()

    def prune(self, gradio) -> None:
        """End every session whose account changed since its login (checked when the users
        file changed: a stat per request otherwise)."""
        version = self.accounts.version
        if version == self._seen:
            return
        with self._lock:
            self._seen = version
            for token, (name, stamp) in list(self._stamps.items()):
                if token not in gradio.tokens:  # logged out (Gradio's /logout)
                    del self._stamps[token]
                elif self.accounts.session_stamp(name) != stamp:
                    del self._stamps[token]
                    gradio.tokens.pop(token, None)


def _logged_in(request: Request, gradio) -> bool:
    """Whether the request carries a session token Gradio knows (its cookies' names)."""
    return any(request.cookies.get(f"access-token{kind}-{gradio.cookie_id}") in gradio.tokens
               for kind in ("", "-unsecure"))


def _to_gradio(request: Request) -> bool:
    """Whether a request goes to what Gradio's login check guards: its API, queue and files
    (under /gradio_api/) and the page's configuration."""
    path = app_path(request.url.path, request.scope.get("root_path", ""))
    return path.startswith("/gradio_api/") or path.rstrip("/") == "/config"


def _answer_stream(request: Request, session: str) -> bool:
    """Whether a request is session's event stream (or its heartbeat): where its answers go."""
    path = app_path(request.url.path, request.scope.get("root_path", "")).rstrip("/")
    return (path == "/gradio_api/queue/data" and request.query_params.get("session_hash") == session
            or path == f"/gradio_api/heartbeat/{session}")


def _gradio(app: FastAPI):
    """The Gradio app mounted at / (its token table and cookie id)."""
    return next(route.app for route in app.routes
                if isinstance(route, Mount) and route.path in ("", "/"))
