"""What may reach the app over HTTP, checked before anything else runs (an ASGI middleware):

- a Host it answers to: on a loopback address, only 127.0.0.1, localhost, [::1] and the
  names configured (`[server] allowed_hosts`), so that a site whose name is made to resolve to
  127.0.0.1 (DNS rebinding) is refused;
- an Origin it trusts: a request a browser sends from another page (it says where from, in
  `Origin`) is served only if that page is this app's own (its host and port are the Host
  asked for) or a configured origin (`[server] allowed_origins`); clients that are not
  browsers send no Origin and are not affected;
- a body it can afford: at most max_body bytes (max_upload for the page's file uploads, which
  are streamed to disk rather than held) as they arrive, whatever Content-Length says;
- text it can keep: a JSON body whose strings hold a lone surrogate ("\\ud800") is refused
  with a 400 naming the field (reame/chats/jsontext.py);
- cookies other sites do not get: Gradio's login cookie is SameSite=None; it goes out as
  SameSite=Lax, so a page of another site cannot send it with its requests.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from reame.chats.jsontext import SURROGATE_ESCAPE, lone_surrogate


def host_name(host: str) -> str:
    """The name of a Host header value, lowercase, without its port: "[::1]:7860" -> "::1"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


UPLOAD_PATH = "/gradio_api/upload"  # the page's file uploads (an import of chats)
# The request bodies taken, in bytes.
MAX_BODY_BYTES = 2 << 20  # any request (the page, the Gradio API, /v1), checked here
MAX_V1_BODY_BYTES = 1 << 20  # /v1's, checked by v1/common.py: far more text than any context
MULTIPART_SLACK = 64 << 10  # an upload's body beyond its file: the form's parts


class Guard:
    """ASGI middleware: refuses what the module's doc says, with a JSON error."""

    def __init__(self, app, *, allowed_hosts: frozenset[str] | None,
                 allowed_origins: frozenset[str], max_body: int = MAX_BODY_BYTES,
                 max_upload: int | None = None):
        """allowed_hosts: the Host names served (None: any, for a server on a public
        address); allowed_origins: other origins ("https://example.org") trusted;
        max_upload: the largest file uploaded through the page (an import): its request may be
        that and MULTIPART_SLACK, if larger than max_body."""
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self.max_body = max_body
        self.max_upload = max(max_upload + MULTIPART_SLACK if max_upload else 0, max_body)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.allowed_hosts is not None and host_name(host) not in self.allowed_hosts:
            await refuse(scope, send, 403, "host_not_allowed",
                          f"this server does not answer to the host name {host!r}; its "
                          f"administrator can add it to [server] allowed_hosts")
            return
        origin = headers.get("origin")
        if origin is not None and not self._trusted(origin, host):
            await refuse(scope, send, 403, "origin_not_allowed",
                          f"requests from pages of {origin} are not allowed; the server's "
                          f"administrator can add it to [server] allowed_origins")
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        upload = scope["path"].endswith(UPLOAD_PATH)
        limit = self.max_upload if upload else self.max_body
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await self._too_large(scope, send, limit)
            return
        if upload:  # streamed to disk by Gradio, not held in memory here; cut past the limit
            await self.app(scope, _counted(receive, limit), _lax_cookies(send))
            return
        body = await self._read_body(receive, limit)
        if body is None:
            await self._too_large(scope, send, limit)
            return
        problem = _not_text(body)
        if problem:
            await refuse(scope, send, 400, "invalid_text", problem[1], param=problem[0])
            return
        await self.app(scope, _replay(body, receive), _lax_cookies(send))

    def _trusted(self, origin: str, host: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.lower()

    async def _read_body(self, receive, limit: int) -> bytes | None:
        """The whole request body, or None past limit (counted as it arrives)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: the app sees what came
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, scope, send, limit: int) -> None:
        await refuse(scope, send, 413, "request_too_large",
                      f"the request body is over {limit:,} bytes")


def _not_text(body: bytes) -> tuple[str, str] | None:
    """(the field, why) when a JSON body holds a string that is not text (a lone surrogate)
    or nests too deeply to be read; None otherwise (including bodies that are not JSON: the
    app says what is wrong with them). Parsed only if a surrogate escape is in the bytes."""
    if not SURROGATE_ESCAPE.search(body):
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        return "body", "the JSON body is nested too deeply"
    except ValueError:
        return None
    where = lone_surrogate(value)
    if where is None:
        return None
    return where, (f"{where} is not valid text: it holds a lone UTF-16 surrogate (such as "
                   f"\\ud800), which no UTF-8 text can; send the text itself")


async def refuse(scope, send, status: int, code: str, message: str,
                  param: str | None = None) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": param, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _counted(receive, limit: int):
    """A receive() that passes the body on as it arrives and, past limit bytes, says the client
    went away (the app stops reading; whatever it wrote so far is its to delete)."""
    size = 0

    async def counted():
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                return {"type": "http.disconnect"}
        return message

    return counted


def _replay(body: bytes, receive):
    """A receive() that gives the body read already, then what the client sends next (a
    disconnect, which streaming responses watch for)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _lax_cookies(send):
    async def patched(message):
        if message["type"] == "http.response.start":
            message["headers"] = [
                (k, _lax(v) if k.lower() == b"set-cookie" else v)
                for k, v in message.get("headers", [])]
        await send(message)

    return patched


def _lax(cookie: bytes) -> bytes:
    """A Set-Cookie value with SameSite=Lax instead of None (or no SameSite)."""
    parts = [p for p in cookie.split(b";") if not p.strip().lower().startswith(b"samesite=")]
    return b";".join(parts) + b"; SameSite=Lax"
