"""Web logins, replacing Gradio's /login route: the same form and cookies, but

- the password check (scrypt, about 50 ms of CPU) runs off the event loop, two at a time at
  most, and costs the same for unknown names (Accounts.check_password);
- failures are limited per address and per name (429 with Retry-After);
- the session holds the user's stable id, not the name (a new user given a deleted user's
  name gets none of the old one's chats), and ends as soon as the account changes: a new
  password, a revoked key, or the user deleted (`python app.py passwd/revokekey/deluser`,
  even while the server runs).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import defaultdict, deque

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.routing import Mount

from ..accounts import Accounts

MAX_FAILURES = 10  # failed logins per address, and per name, within FAILURE_WINDOW_S
FAILURE_WINDOW_S = 600
CONCURRENT_CHECKS = 2  # password checks running at once (each takes a core for ~50 ms)


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


class WebLogins:
    """The logins of the page (and of gradio_client), kept in Gradio's token table."""

    def __init__(self, accounts: Accounts):
        self.accounts = accounts
        self.failures = FailedLogins()
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)
        self._stamps: dict[str, tuple[str, tuple]] = {}  # token -> (name, stamp at login)
        self._lock = threading.Lock()
        self._seen = -1  # the accounts' version last checked

    def install(self, app: FastAPI) -> None:
        """Add the /login route and the check that ends changed accounts' sessions; call it
        before Gradio is mounted (the first matching route answers)."""

        @app.post("/login")
        @app.post("/login/")
        async def login(request: Request):
            return await self._login(request, _gradio(app))

        @app.middleware("http")
        async def end_changed_sessions(request: Request, call_next):
            self.prune(_gradio(app))
            return await call_next(request)

    async def _login(self, request: Request, gradio) -> JSONResponse:
        form = await request.form()
        name = str(form.get("username", "")).strip()[:256]
        password = str(form.get("password", ""))[:1024]
        address = f"address:{request.client.host if request.client else '?'}"
        wait = self.failures.retry_after(address, f"name:{name}")
        if wait:
            return JSONResponse({"detail": f"Too many failed logins: try again in {wait} s."},
                                status_code=429, headers={"Retry-After": str(wait)})
        async with self._checks:
            ok = await run_in_threadpool(self.accounts.check_password, name, password)
        user_id = self.accounts.user_id(name) if ok else None
        if user_id is None:
            self.failures.failed(address, f"name:{name}")
            return JSONResponse({"detail": "Incorrect credentials."}, status_code=400)
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._stamps[token] = (name, self.accounts.session_stamp(name))
            gradio.tokens[token] = user_id
        response = JSONResponse({"success": True})
        # Gradio's cookie names (its pages and API read them); SameSite=Lax (guard.py).
        response.set_cookie(f"access-token-{gradio.cookie_id}", token, httponly=True,
                            samesite="lax", secure=True)
        response.set_cookie(f"access-token-unsecure-{gradio.cookie_id}", token, httponly=True,
                            samesite="lax")
        return response

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


def _gradio(app: FastAPI):
    """The Gradio app mounted at / (its token table and cookie id)."""
    return next(route.app for route in app.routes
                if isinstance(route, Mount) and route.path in ("", "/"))
