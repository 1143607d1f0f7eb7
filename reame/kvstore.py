"""KV files on disk: one per chat and model, plus shared-prefix snapshots.

File layout (little-endian):
    magic b"REAMEKV\\0" | u32 format version | u32 header length | header (JSON, utf-8)
    | tokens (int32 x n_tokens) | state (state_bytes) | u64 xxh3-64 of everything before it

The header holds the fingerprint (model file, KV type, flash attention, llama-cpp-python
version): a file whose fingerprint differs is not restored. It holds the decodes that made
the KV (batches.py): a restored KV is reused only where it gives the same reply. And it holds
the file's scope, whose tokens made it (cache.py: a user's KV serves only that user); the
block hashes that find files by their tokens are salted with the scope. Writes
go to a temp file, fsync, os.replace: a reader sees the old file or the new one, never a
partial one. Any file that cannot be read back exactly is a miss, never an error.

Speed (see bench/restore_profile.py): a file is mapped, not copied, and its checksum (xxh3-64,
three times as fast as zlib's crc32, so it ends before llama.cpp's copy does) runs in a
second thread while llama.cpp loads the state (both release the GIL); the caller checks it with
`KVEntry.verified()` before trusting the KV. Writes happen on one background thread, so a turn
pays only for copying the state out of llama.cpp; any read first waits for pending writes.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import mmap
import os
import re
import struct
import tempfile
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import xxhash

from . import batches as batch_plan
from .batches import Batch

log = logging.getLogger(__name__)

MAGIC = b"REAMEKV\0"
FORMAT_VERSION = 3  # 1: crc32 checksum; 2: no batches
_PREAMBLE = struct.Struct("<8sII")
_SUM = struct.Struct("<Q")
BLOCK = 64  # tokens per block of the shared-prefix chained hash
# The files Reame writes in the folder: anything else there is left alone, whatever its name
# ([cache] dir may be any folder). A .kv file is deleted only if its name and magic say so.
_OWN_NAME = re.compile(r"^(chat-\d+|prefix-[0-9a-f]+)-[0-9a-f]{12}\.kv$")
_TMP_PREFIX = "reame-kv-"


class Head(NamedTuple):
    """What a file holds, from its head only."""

    tokens: list[int]
    batches: list[Batch]
    scope: str


def checksum(data) -> int:
    """The file's checksum: xxh3-64 (releases the GIL on large buffers)."""
    return xxhash.xxh3_64_intdigest(data)


class KVEntry:
    """A mapped KV file: its tokens, its state, and its checksum being verified meanwhile.

    Use it as a context manager (the mapping is closed on exit) and call verified() before
    trusting anything loaded from `state`."""

    def __init__(self, data: mmap.mmap, tokens: list[int], batches: list[Batch], scope: str,
                 body: memoryview, state: memoryview, stored_sum: int):
        self.tokens = tokens
        self.batches = batches
        self.scope = scope
        self.state = state  # writable (a private mapping), so ctypes takes it without a copy
        self._data, self._body, self._stored_sum = data, body, stored_sum
        self._sum: list[int] = []
        self._checker = threading.Thread(target=lambda: self._sum.append(checksum(body)),
                                         name="kv-checksum", daemon=True)
        self._checker.start()

    def verified(self) -> bool:
        """Whether the file's checksum matches (waits for the check to finish)."""
        self._checker.join()
        return self._sum == [self._stored_sum]

    def close(self) -> None:
        self._checker.join()
        for view in (self.state, self._body):
            view.release()
        self._data.close()

    def __enter__(self) -> "KVEntry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class CacheCounters:
    rejected: int = 0  # files found but unusable: corrupt, foreign model, old format
    writes: int = 0
    write_errors: int = 0
    bytes_written: int = 0
    write_ms: float = 0.0  # time spent writing files, on the background writer
    evicted: int = 0

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["write_ms"] = round(self.write_ms, 1)
        return out


class _Writer:
    """One background thread that writes KV files in order; a newer write of a path replaces
    an older one still queued. Shared by every KVStore of the process, so that a reader in
    any of them can wait for a file's pending write."""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[tuple] = []  # (seq, store, path, tokens, state, batches, scope)
        self._latest: dict[Path, int] = {}  # path -> newest write queued or in progress
        self._seq = 0
        self._thread: threading.Thread | None = None

    def submit(self, store: "KVStore", path: Path, tokens: Sequence[int], state,
               batches: Sequence[Batch] | None, scope: str) -> None:
        with self._cond:
            self._seq += 1
            self._latest[path] = self._seq
            self._queue.append((self._seq, store, path, tokens, state, batches, scope))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kv-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, path: Path) -> None:
        """Wait until no write of path is queued or in progress."""
        with self._cond:
            while path in self._latest:
                self._cond.wait()

    def flush(self) -> None:
        """Wait until every write submitted so far is done (on disk, or failed)."""
        with self._cond:
            while self._latest:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                seq, store, path, tokens, state, batches, scope = self._queue.pop(0)
                if self._latest.get(path) != seq:
                    continue  # a newer write of the same file is queued
            try:
                store.write(path, tokens, state, batches, scope)
            except Exception:  # never let the writer die: the file is simply not there
                log.exception("KV file %s not written", path.name)
            finally:
                with self._cond:
                    if self._latest.get(path) == seq:
                        del self._latest[path]
                    self._cond.notify_all()


_writer = _Writer()
atexit.register(_writer.flush)


def flush_writes() -> None:
    """Wait for every KV file queued for writing in this process."""
    _writer.flush()


def block_hashes(tokens: Sequence[int], scope: str = "", block: int = BLOCK) -> list[str]:
    """Chained hash at each block boundary: hashes[i] covers tokens[: (i + 1) * block] of
    scope (salted with it: the same tokens of another scope hash to other names)."""
    out, chain = [], _salt(scope)
    for start in range(0, len(tokens) - block + 1, block):
        digest = hashlib.blake2b(chain + array("i", tokens[start:start + block]).tobytes(),
                                 digest_size=12)
        chain = digest.digest()
        out.append(digest.hexdigest())
    return out


def _salt(scope: str) -> bytes:
    if not scope:
        return b""  # the one scope of a server without accounts: names as before scopes
    return hashlib.blake2b(b"reame-scope\0" + scope.encode(), digest_size=12).digest()


class KVStore:
    """KV files under one folder, kept under a disk budget (least recently used go first)."""

    def __init__(self, folder: Path, *, fingerprint: str, max_bytes: int):
        self.folder = folder
        self.fingerprint = fingerprint
        self.tag = fingerprint_tag(fingerprint)
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self.pinned: set[Path] = set()  # never evicted (the shared prefix every user gets)
        self._lock = threading.Lock()
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{_TMP_PREFIX}*.tmp"):
            stale.unlink(missing_ok=True)

    # names

    def chat_path(self, chat_id: int) -> Path:
        return self.folder / f"chat-{chat_id}-{self.tag}.kv"

    def prefix_path(self, block_hash: str) -> Path:
        return self.folder / f"prefix-{block_hash}-{self.tag}.kv"

    # reading

    def peek(self, path: Path, *, report: bool = True) -> list[int] | None:
        """The tokens a file holds, from its head only; None if absent or not for this model.
        report=False: an unusable file is not counted nor logged (a scan, not a lookup)."""
        head = self.head(path, report=report)
        return head[0] if head is not None else None

    def head(self, path: Path, *, report: bool = True) -> Head | None:
        """The tokens a file holds, the batches that made their KV and its scope."""
        _writer.wait(path)
        try:
            with path.open("rb") as f:
                header_len = self._preamble(path, f.read(_PREAMBLE.size), report)
                if header_len is None:
                    return None
                header = self._header(path, f.read(header_len), report)
                if header is None:
                    return None
                raw = f.read(4 * header["n_tokens"])
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self.reject(path, f"cannot read: {exc.strerror}", report)
        if len(raw) != 4 * header["n_tokens"]:
            return self.reject(path, "truncated", report)
        tokens = array("i")
        tokens.frombytes(raw)
        return Head(tokens.tolist(), header["batches"], header["scope"])

    def _preamble(self, path: Path, raw: bytes | memoryview, report: bool = True) -> int | None:
        """The header's length, if raw starts a file of this format."""
        if len(raw) < _PREAMBLE.size:
            return self.reject(path, "truncated", report)
        magic, version, header_len = _PREAMBLE.unpack_from(raw)
        if magic != MAGIC:
            return self.reject(path, "not a Reame KV file", report)
        if version != FORMAT_VERSION:
            return self.reject(path, f"format version {version}, expected {FORMAT_VERSION}", report)
        return header_len

    def _header(self, path: Path, raw: bytes, report: bool = True) -> dict | None:
        try:
            header = json.loads(raw)
            for key in ("n_tokens", "state_bytes"):
                header[key] = int(header[key])
            fingerprint = header["fingerprint"]
            header["batches"] = batch_plan.decode(header["batches"])
            header["scope"] = header.get("scope", "")
            if not isinstance(header["scope"], str):
                raise TypeError("scope")
        except (ValueError, KeyError, TypeError):
            return self.reject(path, "unreadable header", report)
        if header["batches"] is None or not batch_plan.valid(header["batches"],
                                                             header["n_tokens"]):
            return self.reject(path, "unreadable header", report)
        if fingerprint != self.fingerprint:
            return self.reject(path, "made with another model or KV settings", report)
        return header

    def read(self, path: Path) -> KVEntry | None:
        """The file mapped, its header checked and its checksum started; None (counted, logged)
        if it is not usable. The caller closes the entry and must check entry.verified()."""
        _writer.wait(path)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < _PREAMBLE.size + _SUM.size:
                    return self.reject(path, "truncated")
                # Private and writable: llama.cpp gets the bytes without a copy, and files are
                # only ever replaced (os.replace), never rewritten in place under a mapping.
                data = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return self.reject(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}")
        entry = self._parse(path, data)
        if entry is None:
            data.close()
            return None
        os.utime(path)  # recently used: the last to be evicted
        return entry

    def _parse(self, path: Path, data: mmap.mmap) -> KVEntry | None:
        header_len = self._preamble(path, data)
        if header_len is None:
            return None
        end = len(data) - _SUM.size
        if _PREAMBLE.size + header_len > end:
            return self.reject(path, "truncated")
        header = self._header(path, data[_PREAMBLE.size:_PREAMBLE.size + header_len])
        if header is None:
            return None
        n_tokens, state_bytes = header["n_tokens"], header["state_bytes"]
        start = _PREAMBLE.size + header_len
        if start + 4 * n_tokens + state_bytes != end:
            return self.reject(path, "sizes do not add up (truncated?)")
        tokens = array("i")
        tokens.frombytes(data[start:start + 4 * n_tokens])
        (stored,) = _SUM.unpack_from(data, end)
        body = memoryview(data)[:end]
        return KVEntry(data, tokens.tolist(), header["batches"], header["scope"], body,
                       body[start + 4 * n_tokens:], stored)

    def reject(self, path: Path, why: str, report: bool = True) -> None:
        """Count and log an unusable file; it is a miss, and the next save replaces it."""
        if not report:
            return None
        self.counters.rejected += 1
        log.warning("KV file %s not used: %s", path.name, why)
        return None

    # writing

    def write_later(self, path: Path, tokens: Sequence[int], state: bytes | memoryview,
                    batches: Sequence[Batch] | None = None, scope: str = "") -> None:
        """Queue write(): it happens on the background writer; state must not change after."""
        _writer.submit(self, path, list(tokens), state, batches, scope)

    def flush(self) -> None:
        """Wait until every queued write is done."""
        _writer.flush()

    def write(self, path: Path, tokens: Sequence[int], state: bytes | memoryview,
              batches: Sequence[Batch] | None = None, scope: str = "") -> bool:
        """Atomically replace path; False (logged, counted) if the disk refused. batches: the
        decodes that made the KV (None: unknown, reusable only as a whole); scope: whose."""
        started = time.perf_counter()
        if batches is None:
            batches = [Batch(0, len(tokens), True)] if tokens else []
        header = json.dumps({"fingerprint": self.fingerprint, "n_tokens": len(tokens),
                             "state_bytes": len(state),
                             "batches": batch_plan.encode(batches),
                             "scope": scope}).encode()
        token_bytes = array("i", tokens).tobytes()
        preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header))
        digest = xxhash.xxh3_64()
        for part in (preamble, header, token_bytes, state):
            digest.update(part)
        tmp = None
        try:
            with tempfile.NamedTemporaryFile(dir=self.folder, prefix=_TMP_PREFIX, suffix=".tmp",
                                             delete=False) as f:
                tmp = Path(f.name)
                f.write(preamble)
                f.write(header)
                f.write(token_bytes)
                f.write(state)
                f.write(_SUM.pack(digest.intdigest()))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self.counters.write_errors += 1
            log.warning("KV file %s not written: %s", path.name, exc)
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            return False
        finally:
            self.counters.write_ms += (time.perf_counter() - started) * 1000
        self.counters.writes += 1
        self.counters.bytes_written += len(state) + len(token_bytes) + len(header)
        self.evict()
        return True

    # housekeeping

    def files(self) -> list[Path]:
        """The KV files in the folder (by name), of every model."""
        return [p for p in self.folder.glob("*.kv") if _OWN_NAME.match(p.name) and p.is_file()]

    def own_files(self) -> list[Path]:
        """The files made with this store's fingerprint (by name; the header tells for sure)."""
        return [p for p in self.files() if p.name.endswith(f"-{self.tag}.kv")]

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def evict(self) -> int:
        """Delete least recently used files until the folder fits the budget (the pinned
        ones stay)."""
        with self._lock:
            entries = []
            for p in self.files():
                if p in self.pinned:
                    continue
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, p))
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, p in sorted(entries):
                if total <= self.max_bytes:
                    break
                total -= size
                removed += _delete(p)
            self.counters.evicted += removed
            return removed

    def delete_chat(self, chat_id: int) -> None:
        """Every file of the chat, whatever model made it."""
        _writer.flush()  # or a queued write would bring one back
        for p in self.folder.glob(f"chat-{chat_id}-*.kv"):
            _delete(p)

    def sweep(self, live_chat_ids: set[int]) -> int:
        """Delete the files of chats that no longer exist; return how many."""
        removed = 0
        for p in self.files():
            if p.name.startswith("chat-") and int(p.name.split("-")[1]) not in live_chat_ids:
                removed += _delete(p)
        return removed


def check_folder(folder: Path) -> None:
    """Refuse (ValueError, saying why) a folder that cannot hold the KV files: one that is not
    a folder, cannot be written, or holds other files than Reame's (KV files and their
    temporary files), so that a setting never points the cache at someone else's folder."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir()
                         if not (_OWN_NAME.match(p.name) or (p.name.startswith(_TMP_PREFIX)
                                                              and p.name.endswith(".tmp"))))
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise ValueError(f"{folder} holds {len(foreign)} entries Reame did not write "
                             f"({shown}): choose an empty folder, or one only Reame uses")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=_TMP_PREFIX, suffix=".tmp"):
            pass
    except OSError as exc:
        raise ValueError(f"{folder} cannot be written: {exc.strerror or exc}") from None


def _delete(path: Path) -> bool:
    """Delete a KV file, if it is one Reame wrote (its name and magic say so)."""
    if not _OWN_NAME.match(path.name):
        return False
    try:
        with path.open("rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return False
        path.unlink()
    except OSError:  # gone meanwhile, or not ours to delete
        return False
    return True


def fingerprint_tag(fingerprint: str) -> str:
    """A short, file-name-safe tag of a fingerprint."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=6).hexdigest()
