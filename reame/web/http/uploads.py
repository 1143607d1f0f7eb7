"""Files uploaded through the page (an import of chats), kept for the session that sent them.

Gradio's upload route keeps any file anyone sends in its temp folder, and an event that takes a
file is handed whatever path its client names. So every upload passes through this ledger (an
ASGI middleware in front of the route):

- only the kinds the page takes up to max_bytes are kept: chats to import (`.json`, starting
  like JSON) and documents to attach to a message (text, Markdown and code holding no NUL
  byte where it starts, PDFs starting with `%PDF-`: reame/chats/documents.py); any other file
  is deleted at once and the upload refused with a message that says why;
- each file kept is recorded for the session that sent it (its login cookie; without accounts
  the server has one user, and the key is the same for everyone);
- an event gets a file's content by its path only if its own session uploaded it, and only
  once (`take`): the file is deleted as it is read. A path that was not uploaded, was uploaded
  by another session, was taken already or does not exist gets the same refusal;
- a session may keep MAX_WAITING files not taken yet; files not taken within KEEP_S are deleted.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from reame.chats import documents
from reame.web.http.guard import UPLOAD_PATH, refuse

KINDS = tuple(dict.fromkeys((".json", *documents.KINDS)))
KEEP_S = 600.0  # an upload not imported within 10 minutes is deleted
MAX_WAITING = 4  # uploads of one session not taken yet


class UploadRefused(Exception):
    """An event named a file its session may not read."""


@dataclass
class _Kept:
    keys: set[str] = field(default_factory=set)  # the sessions that uploaded this content
    at: float = 0.0


def session_key(cookie_header: str) -> str:
    """Whom an upload belongs to: a digest of the request's Gradio login cookies
    ("access-token-…"), or "" without a login (a server without accounts has one user)."""
    tokens = sorted(part.strip() for part in cookie_header.split(";")
                    if part.strip().startswith("access-token"))
    if not tokens:
        return ""
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()


class Uploads:
    """The ledger: `wrap` puts it in front of the app, `take` is for the events that read an
    upload."""

    def __init__(self, *, max_bytes: int, kinds: tuple[str, ...] = KINDS,
                 keep_s: float = KEEP_S, max_waiting: int = MAX_WAITING):
        self.max_bytes = max_bytes
        self.kinds = kinds
        self.keep_s = keep_s
        self.max_waiting = max_waiting
        self._kept: dict[str, _Kept] = {}  # resolved path -> who may take it
        self._emptied: set[Path] = set()  # digest folders a deletion may have left empty
        self._lock = threading.Lock()

    # The middleware.

    def wrap(self, app):
        """app (ASGI) with its upload route kept by this ledger."""

        async def guarded(scope, receive, send):
            if (scope["type"] == "http" and scope.get("method") == "POST"
                    and scope["path"].endswith(UPLOAD_PATH)):
                await self._upload(app, scope, receive, send)
            else:
                await app(scope, receive, send)

        return guarded

    async def _upload(self, app, scope, receive, send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        key = session_key(headers.get("cookie", ""))
        self.expire()
        self._sweep()
        if self.waiting(key) >= self.max_waiting:
            await refuse(scope, send, 429, "too_many_uploads",
                         f"{self.max_waiting} uploaded files wait to be imported; import them "
                         f"or wait {self.keep_s / 60:.0f} minutes", param="files")
            return
        start, body = {}, []

        async def keep(message):
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                body.append(message.get("body", b""))

        await app(scope, receive, keep)
        if not start:
            return
        if start["status"] != 200:
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(body)})
            return
        paths = [Path(p).resolve() for p in json.loads(b"".join(body))]
        problem = next(filter(None, map(self._problem, paths)), None)
        if problem:
            for path in paths:
                self._discard(path)
            status, message = problem
            await refuse(scope, send, status, "upload_refused", message, param="files")
            return
        now = time.monotonic()
        with self._lock:
            for path in paths:
                kept = self._kept.setdefault(str(path), _Kept())
                kept.keys.add(key)
                kept.at = now
        await send(start)
        await send({"type": "http.response.body", "body": b"".join(body)})

    def _problem(self, path: Path) -> tuple[int, str] | None:
        """Why an uploaded file is not kept (the HTTP status and the words), or None."""
        kind = path.suffix.lower()
        if kind not in self.kinds:
            return 415, (f"this kind of file cannot be uploaded here: only chats exported "
                         f"from Reame or ChatGPT (.json) and documents "
                         f"({', '.join(k for k in self.kinds if k != '.json')})")
        try:
            size = path.stat().st_size
            with path.open("rb") as file:
                start = file.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
        except OSError:
            return 400, "the upload could not be read back"
        if size > self.max_bytes:
            return 413, f"the file is over {self.max_bytes:,} bytes"
        if kind == ".json" and start[:1] not in (b"{", b"["):
            return 415, "this kind of file cannot be uploaded here: the file is not JSON"
        if kind == documents.PDF and not start.startswith(b"%PDF-"):
            return 415, "this kind of file cannot be uploaded here: the file is not a PDF"
        if kind != documents.PDF and b"\0" in start:
            return 415, "this kind of file cannot be uploaded here: the file is not text"
        return None

    # The events' side.

    def take(self, path: str | Path, key: str) -> bytes:
        """The content of an upload of this session, once; the file is deleted."""
        resolved = str(Path(path).resolve())
        self.expire()
        with self._lock:
            kept = self._kept.get(resolved)
            if kept is None or key not in kept.keys:
                raise UploadRefused("this file was not uploaded here in this session: "
                                    "upload it again")
            kept.keys.discard(key)
            last = not kept.keys
            if last:
                del self._kept[resolved]
        try:
            return Path(resolved).read_bytes()
        except OSError:
            raise UploadRefused("the uploaded file is gone: upload it again") from None
        finally:
            if last:
                self._delete(Path(resolved))

    def waiting(self, key: str) -> int:
        with self._lock:
            return sum(key in kept.keys for kept in self._kept.values())

    def expire(self) -> None:
        """Delete the uploads nobody took within keep_s."""
        cutoff = time.monotonic() - self.keep_s
        with self._lock:
            old = [path for path, kept in self._kept.items() if kept.at < cutoff]
            for path in old:
                del self._kept[path]
        for path in old:
            self._delete(Path(path))

    def _discard(self, path: Path) -> None:
        """A refused upload: deleted, unless the same content is kept for someone."""
        with self._lock:
            if str(path) in self._kept:
                return
        self._delete(path)

    def _delete(self, path: Path) -> None:
        """The file; its folder (Gradio gives each upload a folder named by its content's
        digest) is removed later by _sweep, not here: a take runs on an event's thread, and
        another upload of the same content may be between making that folder and moving its
        file in (which failed with a 500 when the folder went in between)."""
        path.unlink(missing_ok=True)
        with self._lock:
            self._emptied.add(path.parent)

    def _sweep(self) -> None:
        """Remove the digest folders deletions left empty. Only on the event loop, before
        an upload is handed to Gradio: Gradio makes a folder and moves a file into it with no
        await in between, so no upload is ever between the two while this runs."""
        with self._lock:
            folders, self._emptied = self._emptied, set()
        for folder in folders:
            try:
                folder.rmdir()
            except OSError:
                pass  # gone already, or not empty: another file of the same content

