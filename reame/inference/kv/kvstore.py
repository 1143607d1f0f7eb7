"""The store of KV files: one per chat and model, plus shared-prefix snapshots.

What one file holds and how it is read and written is kvfile.py; where the files' bytes are
kept is a Blobs (blobs.py: the local folder), which knows them by name ("chat-12-<tag>.kv"),
the key every method here takes. This module names the files, finds them, writes them in the
background, keeps them under their disk budget, and keeps count of the chats that have a file
(ready_chats, for the Cache panel). Any
file that cannot be read back exactly is a miss, counted and logged, never an error. The
block hashes that find files by their tokens are salted with the scope (whose tokens made
them: cache.py).

Writes happen on a background thread, each store's own (_Writer), so a turn pays only for
copying the state out of llama.cpp; a read of a file first waits for its pending write.
"""

from __future__ import annotations

import hashlib
import logging
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
from reame.inference.kv.blobs import TMP_PREFIX, BlobInfo, Blobs
from reame.inference.kv.kvfile import MAGIC, Head, KVEntry, Unusable, checksum
from reame.inference.scope import NO_ACCOUNTS, Scope

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per block of the shared-prefix chained hash
# The files Reame writes in the folder: anything else there is left alone, whatever its name
# ([cache] dir may be any folder). A .kv file is deleted only if its name and magic say so.
_OWN_NAME = re.compile(r"^(chat-\d+|prefix-[0-9a-f]+)-[0-9a-f]{12}\.kv$")
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
    """A background thread that writes KV files in order; a newer write of a key replaces
    an older one still queued. The thread runs while there is work, and is not a daemon: a
    normal exit (Ctrl-C included) waits for it, so every queued write lands. (SIGTERM's default
    ends the process at once: app.py flushes first.)"""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[tuple[int, str, Callable[[], object]]] = []
        self._latest: dict[str, int] = {}  # key -> newest write queued or in progress
        self._seq = 0
        self._thread: threading.Thread | None = None

    def submit(self, key: str, write: Callable[[], object]) -> None:
        """Queue write(), which writes key's file."""
        with self._cond:
            self._seq += 1
            self._latest[key] = self._seq
            self._queue.append((self._seq, key, write))
            if self._thread is None or not self._thread.is_alive():
                # not a daemon even when a daemon thread submits (it would pass that on)
                self._thread = threading.Thread(target=self._run, name="kv-writer",
                                                daemon=False)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, key: str) -> None:
        """Wait until no write of key's file is queued or in progress."""
        with self._cond:
            while key in self._latest:
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
                seq, key, write = self._queue.pop(0)
                if self._latest.get(key) != seq:
                    continue  # a newer write of the same file is queued
            try:
                write()
            except Exception:  # never let the writer die: the file is simply not there
                log.exception("KV file %s not written", key)
            finally:
                with self._cond:
                    if self._latest.get(key) == seq:
                        del self._latest[key]
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
    """KV files in one Blobs, kept under a disk budget (least recently used go first).

    Each store writes on its own background thread, and its reads wait for its own writes:
    flush() one store before another reads the same blobs (a new model's, a restart's).
    A file is named by its key (chat_key, prefix_key), never by a key."""

    def __init__(self, blobs: Blobs, *, fingerprint: str, max_bytes: int):
        self.blobs = blobs
        self.fingerprint = fingerprint
        self.tag = fingerprint_tag(fingerprint)
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self.pinned: set[str] = set()  # never evicted (the shared prefix every user gets)
        self._lock = threading.Lock()
        self._writer = _Writer()
        # The chats with a file of this store's model (by name), kept as this store writes
        # and deletes them, from the files found at start: counting the chats ready to
        # continue looks at no file (files another process sharing the folder writes or
        # deletes meanwhile are seen at the next start).
        self._ready_lock = threading.Lock()
        self._ready = {chat_id for chat_id in map(self._chat_of, self.own_files())
                       if chat_id is not None}

    @property
    def folder(self) -> Path | None:
        """The local folder the files are in, if they are in one."""
        return self.blobs.folder

    # names

    def chat_key(self, chat_id: int) -> str:
        return f"chat-{chat_id}-{self.tag}.kv"

    def prefix_key(self, block_hash: str) -> str:
        return f"prefix-{block_hash}-{self.tag}.kv"

    def exists(self, key: str) -> bool:
        return self.blobs.exists(key)

    def _chat_of(self, key: str) -> int | None:
        """The chat whose file key names, if it is a chat's file of this store's model."""
        kind, _, rest = key.partition("-")
        number, _, end = rest.partition("-")
        if kind != "chat" or not number.isdigit() or end != f"{self.tag}.kv":
            return None
        return int(number)

    def ready_chats(self) -> frozenset[int]:
        """The chats with a file of this store's model: as exists(chat_key(chat_id)) says,
        without looking at the folder (see __init__)."""
        with self._ready_lock:
            return frozenset(self._ready)

    # reading

    def peek(self, key: str, *, report: bool = True) -> list[int] | None:
        """The tokens a file holds, from its head only; None if absent or not for this model.
        report=False: an unusable file is not counted nor logged (a scan, not a lookup)."""
        head = self.head(key, report=report)
        return head[0] if head is not None else None

    def head(self, key: str, *, report: bool = True) -> Head | None:
        """The tokens a file holds, the batches that made their KV and its scope."""
        self._writer.wait(key)
        try:
            return kvfile.read_head(self.blobs, key, self.fingerprint)
        except Unusable as exc:
            return self.reject(key, str(exc), report)

    def read(self, key: str) -> KVEntry | None:
        """The file mapped, its header checked and its checksum started; None (counted, logged)
        if it is not usable. The caller closes the entry and must check entry.verified()."""
        self._writer.wait(key)
        try:
            entry = kvfile.load(self.blobs, key, self.fingerprint)
        except Unusable as exc:
            return self.reject(key, str(exc))
        if entry is not None:
            self.blobs.touch(key)  # recently used: the last to be evicted
        return entry

    def reject(self, key: str, why: str, report: bool = True) -> None:
        """Count and log an unusable file; it is a miss, and the next save replaces it."""
        if not report:
            return None
        self.counters.rejected += 1
        log.warning("KV file %s not used: %s", key, why)
        return None

    # writing

    def write_later(self, key: str, tokens: Sequence[int], state: bytes | memoryview,
                    batches: Sequence[Batch] | None = None,
                    scope: Scope = NO_ACCOUNTS, marks: Sequence = ()) -> None:
        """Queue write(): it happens on the background writer; state and the marks' must not
        change after."""
        self._writer.submit(key, partial(self.write, key, list(tokens), state, batches, scope,
                                          list(marks)))

    def flush(self) -> None:
        """Wait until every queued write is done."""
        self._writer.flush()

    def write(self, key: str, tokens: Sequence[int], state: bytes | memoryview,
              batches: Sequence[Batch] | None = None,
              scope: Scope = NO_ACCOUNTS, marks: Sequence = ()) -> bool:
        """Atomically replace key's file; False (logged, counted) if the storage refused.
        batches: the decodes that made the KV (None: unknown, reusable only as a whole);
        scope: whose; marks: where else it resumes exactly (kvfile.py)."""
        started = time.perf_counter()
        try:
            written = kvfile.write(self.blobs, key, self.fingerprint, tokens, state, batches,
                                   scope, marks)
        except OSError as exc:
            self.counters.write_errors += 1
            log.warning("KV file %s not written: %s", key, exc)
            return False
        finally:
            self.counters.write_ms += (time.perf_counter() - started) * 1000
        self.counters.writes += 1
        self.counters.bytes_written += written
        chat_id = self._chat_of(key)
        if chat_id is not None:
            with self._ready_lock:
                self._ready.add(chat_id)
        self.evict()
        return True

    # housekeeping

    def listing(self) -> list[BlobInfo]:
        """The KV files there are (by name), of every model, with their sizes and last use."""
        return [b for b in self.blobs.list() if _OWN_NAME.match(b.key)]

    def files(self) -> list[str]:
        """The KV files there are (by name), of every model."""
        return [b.key for b in self.listing()]

    def own_files(self) -> list[str]:
        """The files made with this store's fingerprint (by name; the header tells for sure)."""
        return [key for key in self.files() if key.endswith(f"-{self.tag}.kv")]

    def disk_bytes(self) -> int:
        return sum(b.size for b in self.listing())

    def evict(self) -> int:
        """Delete least recently used files until the folder fits the budget (the pinned
        ones stay)."""
        with self._lock:
            entries = [(b.used_ns, b.size, b.key) for b in self.listing()
                       if b.key not in self.pinned]
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
        for key in self.files():
            if key.startswith(f"chat-{chat_id}-"):
                self._delete(key)

    def sweep(self, live_chat_ids: set[int]) -> int:
        """Delete the files of chats that no longer exist; return how many."""
        removed = 0
        for key in self.files():
            if key.startswith("chat-") and int(key.split("-")[1]) not in live_chat_ids:
                removed += self._delete(key)
        return removed

    def _delete(self, key: str) -> bool:
        """Delete a KV file (the module's _delete); a chat whose file is gone (deleted here,
        or found gone) is no longer ready to continue."""
        deleted = _delete(self.blobs, key)
        chat_id = self._chat_of(key)
        if chat_id is not None and (deleted or not self.blobs.exists(key)):
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


def _delete(blobs: Blobs, key: str) -> bool:
    """Delete a KV file, if it is one Reame wrote (its name and magic say so)."""
    if not _OWN_NAME.match(key):
        return False
    try:
        f = blobs.open(key)
        if f is None:
            return False
        with f:
            if f.read(len(MAGIC)) != MAGIC:
                return False
    except OSError:  # not ours to read
        return False
    return blobs.delete(key)


def fingerprint_tag(fingerprint: str) -> str:
    """A short, file-name-safe tag of a fingerprint."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=6).hexdigest()


# checksum is kvfile's; named here too, as the store's users have always imported it.
__all__ = ["BLOCK", "CacheCounters", "KVStore", "block_hashes", "check_folder", "checksum",
           "fingerprint_tag"]
