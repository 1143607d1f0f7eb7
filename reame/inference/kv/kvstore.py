"""The folder of KV files: one per chat and model, plus shared-prefix snapshots.

What one file holds and how it is read and written is kvfile.py; this module names the files,
finds them, writes them in the background, keeps the folder under its disk budget, and keeps
count of the chats that have a file (ready_chats, for the Cache panel). Any
file that cannot be read back exactly is a miss, counted and logged, never an error. The
block hashes that find files by their tokens are salted with the scope (whose tokens made
them: cache.py).

Writes happen on a background thread, each store's own (_Writer), so a turn pays only for
copying the state out of llama.cpp; a read of a file first waits for its pending write.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import reame.inference.kv.kvfile as kvfile
from reame.inference.batches import Batch
from reame.inference.kv.kvfile import MAGIC, TMP_PREFIX, Head, KVEntry, Unusable, checksum
from reame.inference.scope import NO_ACCOUNTS, Scope

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per block of the shared-prefix chained hash
# The files Reame writes in the folder: anything else there is left alone, whatever its name
# ([cache] dir may be any folder). A .kv file is deleted only if its name and magic say so.
_OWN_NAME = re.compile(r"^(chat-\d+|prefix-[0-9a-f]+)-[0-9a-f]{12}\.kv$")
STALE_TMP_S = 600  # a temp file this old is no write under way
TOTALS_NAME = "reame-totals.json"  # the cache's figures, kept beside its files (cache.py)
# The exact tokens of replies to stateless clients (reame.chats.conversation.ReplyMemory), so
# that a conversation resent after a restart finds its KV file.
REPLIES_NAME = "reame-replies.jsonl"


def is_own_name(name: str) -> bool:
    """Whether a file of that name in the KV folder is Reame's (a KV file, the totals or the
    replies' tokens)."""
    return bool(_OWN_NAME.match(name)) or name in (TOTALS_NAME, REPLIES_NAME)


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
    """A background thread that writes KV files in order; a newer write of a path replaces
    an older one still queued. The thread runs while there is work, and is not a daemon: a
    normal exit (Ctrl-C included) waits for it, so every queued write lands. (SIGTERM's default
    ends the process at once: app.py flushes first.)"""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[tuple[int, Path, Callable[[], object]]] = []
        self._latest: dict[Path, int] = {}  # path -> newest write queued or in progress
        self._seq = 0
        self._thread: threading.Thread | None = None

    def submit(self, path: Path, write: Callable[[], object]) -> None:
        """Queue write(), which writes path."""
        with self._cond:
            self._seq += 1
            self._latest[path] = self._seq
            self._queue.append((self._seq, path, write))
            if self._thread is None or not self._thread.is_alive():
                # not a daemon even when a daemon thread submits (it would pass that on)
                self._thread = threading.Thread(target=self._run, name="kv-writer",
                                                daemon=False)
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
                if not self._queue:
                    self._thread = None  # nothing to do: the next submit starts a thread
                    return
                seq, path, write = self._queue.pop(0)
                if self._latest.get(path) != seq:
                    continue  # a newer write of the same file is queued
            try:
                write()
            except Exception:  # never let the writer die: the file is simply not there
                log.exception("KV file %s not written", path.name)
            finally:
                with self._cond:
                    if self._latest.get(path) == seq:
                        del self._latest[path]
                    self._cond.notify_all()


def block_hashes(tokens: Sequence[int], scope: Scope = NO_ACCOUNTS,
                 block: int = BLOCK) -> list[str]:
    """Chained hash at each block boundary: hashes[i] covers tokens[: (i + 1) * block] of
    scope (salted with it: the same tokens of another scope hash to other names)."""
    out, chain = [], _salt(scope)
    for start in range(0, len(tokens) - block + 1, block):
        digest = hashlib.blake2b(chain + array("i", tokens[start:start + block]).tobytes(),
                                 digest_size=12)
        chain = digest.digest()
        out.append(digest.hexdigest())
    return out


def _salt(scope: Scope) -> bytes:
    if not scope:
        return b""  # the one scope of a server without accounts: names as before scopes
    return hashlib.blake2b(b"reame-scope\0" + scope.encode(), digest_size=12).digest()


class KVStore:
    """KV files under one folder, kept under a disk budget (least recently used go first).

    Each store writes on its own background thread, and its reads wait for its own writes:
    flush() one store before another reads the same folder (a new model's, a restart's)."""

    def __init__(self, folder: Path, *, fingerprint: str, max_bytes: int):
        self.folder = folder
        self.fingerprint = fingerprint
        self.tag = fingerprint_tag(fingerprint)
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self.pinned: set[Path] = set()  # never evicted (the shared prefix every user gets)
        self._lock = threading.Lock()
        self._writer = _Writer()
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{TMP_PREFIX}*.tmp"):
            # Left by a process that ended mid-write; a fresh one may be another process's
            # write under way (nodes sharing the folder).
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_TMP_S:
                    stale.unlink()
        # The chats with a file of this store's model (by name), kept as this store writes
        # and deletes them, from the files found at start: counting the chats ready to
        # continue looks at no file (files another process sharing the folder writes or
        # deletes meanwhile are seen at the next start).
        self._ready_lock = threading.Lock()
        self._ready = {chat_id for chat_id in map(self._chat_of, self.own_files())
                       if chat_id is not None}

    # names

    def chat_path(self, chat_id: int) -> Path:
        return self.folder / f"chat-{chat_id}-{self.tag}.kv"

    def prefix_path(self, block_hash: str) -> Path:
        return self.folder / f"prefix-{block_hash}-{self.tag}.kv"

    def _chat_of(self, path: Path) -> int | None:
        """The chat whose file path is, if it is a chat's file of this store's model."""
        kind, _, rest = path.name.partition("-")
        number, _, end = rest.partition("-")
        if kind != "chat" or not number.isdigit() or end != f"{self.tag}.kv":
            return None
        return int(number)

    def ready_chats(self) -> frozenset[int]:
        """The chats with a file of this store's model: as chat_path(chat_id).exists() says,
        without looking at the folder (see __init__)."""
        with self._ready_lock:
            return frozenset(self._ready)

    # reading

    def peek(self, path: Path, *, report: bool = True) -> list[int] | None:
        """The tokens a file holds, from its head only; None if absent or not for this model.
        report=False: an unusable file is not counted nor logged (a scan, not a lookup)."""
        head = self.head(path, report=report)
        return head[0] if head is not None else None

    def head(self, path: Path, *, report: bool = True) -> Head | None:
        """The tokens a file holds, the batches that made their KV and its scope."""
        self._writer.wait(path)
        try:
            return kvfile.read_head(path, self.fingerprint)
        except Unusable as exc:
            return self.reject(path, str(exc), report)

    def read(self, path: Path) -> KVEntry | None:
        """The file mapped, its header checked and its checksum started; None (counted, logged)
        if it is not usable. The caller closes the entry and must check entry.verified()."""
        self._writer.wait(path)
        try:
            entry = kvfile.load(path, self.fingerprint)
        except Unusable as exc:
            return self.reject(path, str(exc))
        if entry is not None:
            os.utime(path)  # recently used: the last to be evicted
        return entry

    def reject(self, path: Path, why: str, report: bool = True) -> None:
        """Count and log an unusable file; it is a miss, and the next save replaces it."""
        if not report:
            return None
        self.counters.rejected += 1
        log.warning("KV file %s not used: %s", path.name, why)
        return None

    # writing

    def write_later(self, path: Path, tokens: Sequence[int], state: bytes | memoryview,
                    batches: Sequence[Batch] | None = None,
                    scope: Scope = NO_ACCOUNTS, marks: Sequence = ()) -> None:
        """Queue write(): it happens on the background writer; state and the marks' must not
        change after."""
        self._writer.submit(path, partial(self.write, path, list(tokens), state, batches, scope,
                                          list(marks)))

    def flush(self) -> None:
        """Wait until every queued write is done."""
        self._writer.flush()

    def write(self, path: Path, tokens: Sequence[int], state: bytes | memoryview,
              batches: Sequence[Batch] | None = None,
              scope: Scope = NO_ACCOUNTS, marks: Sequence = ()) -> bool:
        """Atomically replace path; False (logged, counted) if the disk refused. batches: the
        decodes that made the KV (None: unknown, reusable only as a whole); scope: whose;
        marks: where else it resumes exactly (kvfile.py)."""
        started = time.perf_counter()
        try:
            written = kvfile.write(path, self.fingerprint, tokens, state, batches, scope, marks)
        except OSError as exc:
            self.counters.write_errors += 1
            log.warning("KV file %s not written: %s", path.name, exc)
            return False
        finally:
            self.counters.write_ms += (time.perf_counter() - started) * 1000
        self.counters.writes += 1
        self.counters.bytes_written += written
        chat_id = self._chat_of(path)
        if chat_id is not None:
            with self._ready_lock:
                self._ready.add(chat_id)
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
                removed += self._delete(p)
            self.counters.evicted += removed
            return removed

    def delete_chat(self, chat_id: int) -> None:
        """Every file of the chat, whatever model made it."""
        self._writer.flush()  # or a queued write would bring one back
        for p in self.folder.glob(f"chat-{chat_id}-*.kv"):
            self._delete(p)

    def sweep(self, live_chat_ids: set[int]) -> int:
        """Delete the files of chats that no longer exist; return how many."""
        removed = 0
        for p in self.files():
            if p.name.startswith("chat-") and int(p.name.split("-")[1]) not in live_chat_ids:
                removed += self._delete(p)
        return removed

    def _delete(self, path: Path) -> bool:
        """Delete a KV file (the module's _delete); a chat whose file is gone (deleted here,
        or found gone) is no longer ready to continue."""
        deleted = _delete(path)
        chat_id = self._chat_of(path)
        if chat_id is not None and (deleted or not path.exists()):
            with self._ready_lock:
                self._ready.discard(chat_id)
        return deleted


def check_folder(folder: Path) -> None:
    """Refuse (ValueError, saying why) a folder that cannot hold the KV files: one that is not
    a folder, cannot be written, or holds other files than Reame's (KV files, their
    temporary files, the cache's totals), so that a setting never points the cache at someone else's folder."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir()
                         if not (is_own_name(p.name)
                                 or (p.name.startswith(TMP_PREFIX) and p.name.endswith(".tmp"))))
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise ValueError(f"{folder} holds {len(foreign)} entries Reame did not write "
                             f"({shown}): choose an empty folder, or one only Reame uses")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=TMP_PREFIX, suffix=".tmp"):
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


# checksum is kvfile's; named here too, as the store's users have always imported it.
__all__ = ["BLOCK", "CacheCounters", "KVStore", "block_hashes", "check_folder", "checksum",
           "fingerprint_tag"]
