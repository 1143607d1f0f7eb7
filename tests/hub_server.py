"""A stand-in for the Hugging Face Hub on 127.0.0.1, so that no test ever reaches the internet.

It answers what huggingface_hub 2.4.0 asks for a download (file_download.get_hf_file_metadata,
http_get, HfApi.get_paths_info), as the real Hub answers it:

- HEAD/GET /{owner}/{name}/resolve/{revision}/{path}: for an LFS file a 302 to the "CDN" (a
  second server: another origin, as cdn-lfs.hf.co is) with X-Repo-Commit, ETag (git's blob id),
  X-Linked-Etag (the content's sha256) and X-Linked-Size; for a file kept in git, the bytes.
  Errors carry X-Error-Code as the Hub's do: RepoNotFound (401, as for a private repository),
  RevisionNotFound and EntryNotFound (404).
- GET /cdn/{sha256} on the CDN: the bytes, with Range (206) for a resumed download.
- POST /api/models/{owner}/{name}/paths-info/{revision}: size, git oid and lfs {oid, size}.

Knobs, for the next content GET only: cut_after (close the connection after N bytes),
stall_after (send N bytes, set `stalled`, then wait for `release`). corrupt: serve damaged bytes
under the true checksum. Every request is kept in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "5f1c0ffee5f1c0ffee5f1c0ffee5f1c0ffee5f1c"
SLICE = 1 << 20  # bytes written at a time


@dataclass(frozen=True)
class HubFile:
    """A file of the Hub; its hashes computed once (a request asks for them several times,
    each a pass over the model's 98 MB: about a second per pull before)."""

    content: bytes
    lfs: bool = True

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @cached_property
    def pointer(self) -> bytes:
        """What git stores for an LFS file."""
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
                f"size {len(self.content)}\n").encode()

    @cached_property
    def blob_id(self) -> str:
        """git's sha1 of what it stores: the pointer for an LFS file, else the content."""
        stored = self.pointer if self.lfs else self.content
        return hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()


@dataclass(frozen=True)
class Seen:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """Two threaded HTTP servers, the Hub and its CDN, serving files given as
    {repo_id: {path: bytes}} at COMMIT (revision "main" or the commit itself)."""

    def __init__(self, repos: dict[str, dict[str, bytes]], *, lfs: bool = True):
        self.repos = {repo: {path: HubFile(content, lfs) for path, content in files.items()}
                      for repo, files in repos.items()}
        self.requests: list[Seen] = []
        self.corrupt = False
        self.cut_after: int | None = None
        self.stall_after: int | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, role))
                         for role in ("hub", "cdn")]
        for server in self._servers:
            server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def __enter__(self) -> "FakeHub":
        for server in self._servers:  # polled often: shutdown() waits for the next poll
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                             daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def seen(self, server: str, method: str = "GET") -> list[Seen]:
        return [r for r in self.requests if r.server == server and r.method == method]

    def by_sha256(self, sha256: str) -> HubFile | None:
        return next((f for files in self.repos.values() for f in files.values()
                     if f.sha256 == sha256), None)

    def take_knobs(self) -> tuple[int | None, int | None]:
        """cut_after and stall_after for this content GET; the next ones get neither."""
        with self._lock:
            knobs = (self.cut_after, self.stall_after)
            self.cut_after = self.stall_after = None
            return knobs


def _handler(hub: FakeHub, role: str) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_HubHandler,), {"hub": hub, "role": role})


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub
    role: str

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def do_POST(self) -> None:
        self._record()
        parts = self._parts()
        # /api/models/{owner}/{name}/paths-info/{revision}
        if self.role == "hub" and parts[:2] == ["api", "models"] and len(parts) == 6 \
                and parts[4] == "paths-info":
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            return self._paths_info(f"{parts[2]}/{parts[3]}", parts[5], form.get("paths", []))
        self._error(404, "NotFound", "no such endpoint")

    # routes

    def _route(self, *, body: bool) -> None:
        self._record()
        parts = self._parts()
        if self.role == "cdn" and len(parts) == 2 and parts[0] == "cdn":
            found = self.hub.by_sha256(parts[1])
            if found is None:
                return self._error(404, "NotFound", "no such object")
            return self._content(found, body=body)
        if self.role == "hub" and len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]),
                                 body=body)
        self._error(404, "NotFound", "no such endpoint")

    def _resolve(self, repo: str, revision: str, path: str, *, body: bool) -> None:
        files = self._files(repo, revision)
        if files is None:
            return
        found = files.get(path)
        if found is None:
            return self._error(404, "EntryNotFound", "Entry not found",
                               {"X-Repo-Commit": COMMIT})
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{found.blob_id}"'}
        if not found.lfs:
            return self._content(found, body=body, headers=headers)
        headers |= {"X-Linked-Etag": f'"{found.sha256}"', "X-Linked-Size": str(len(found.content)),
                    "Location": f"{self.hub.cdn_url}/cdn/{found.sha256}"}
        self._send(302, headers, b"")

    def _paths_info(self, repo: str, revision: str, paths: list[str]) -> None:
        files = self._files(repo, revision)
        if files is None:
            return
        entries = []
        for path in paths:
            found = files.get(path)
            if found is None:
                continue
            entry = {"type": "file", "path": path, "oid": found.blob_id,
                     "size": len(found.content)}
            if found.lfs:
                entry["lfs"] = {"oid": found.sha256, "size": len(found.content),
                                "pointerSize": len(found.pointer)}
            entries.append(entry)
        self._send(200, {"Content-Type": "application/json"}, json.dumps(entries).encode())

    def _files(self, repo: str, revision: str) -> dict[str, HubFile] | None:
        """The repository's files at revision, or None once the Hub's error is sent."""
        files = self.hub.repos.get(repo)
        if files is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if unquote(revision) not in ("main", COMMIT):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return files

    def _content(self, found: HubFile, *, body: bool, headers: dict | None = None) -> None:
        data = found.content
        if self.hub.corrupt:
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        start, status = 0, 200
        headers = {**(headers or {}), "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and wanted.endswith("-"):
            start, status = int(wanted[6:-1]), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if not body:
            return self._send(status, headers, b"", length=len(data) - start)
        cut, stall = self.hub.take_knobs()
        self._send(status, headers, data[start:], cut=cut, stall=stall)

    # plumbing

    def _parts(self) -> list[str]:
        return [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]

    def _record(self) -> None:
        self.hub.requests.append(Seen(self.role, self.command, urlsplit(self.path).path,
                                      self.headers.get("Range"),
                                      self.headers.get("Authorization")))

    def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
        body = json.dumps({"error": message}).encode() if self.command != "HEAD" else b""
        self._send(status, {**(headers or {}), "X-Error-Code": code, "X-Error-Message": message,
                            "Content-Type": "application/json"}, body,
                   length=len(json.dumps({"error": message}).encode()))

    def _send(self, status: int, headers: dict, body: bytes, *, length: int | None = None,
              cut: int | None = None, stall: int | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        try:
            self._write(body, cut=cut, stall=stall)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True

    def _write(self, body: bytes, *, cut: int | None, stall: int | None) -> None:
        sent = 0
        while sent < len(body):
            if cut is not None and sent >= cut:
                self.close_connection = True  # the body ends short: a dropped connection
                return
            if stall is not None and sent >= stall:
                self.hub.stalled.set()
                self.hub.release.wait(120)
                stall = None
            end = min(len(body), sent + SLICE,
                      *(limit for limit in (cut, stall) if limit is not None and limit > sent))
            self.wfile.write(body[sent:end])
            sent = end
