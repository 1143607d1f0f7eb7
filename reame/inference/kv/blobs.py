"""Where KV blobs are kept: one small interface, and the local folder that implements it.

A blob is a KV file's bytes (kvfile.py) or one of the small files kept beside them (the
cache's totals), named by a key such as "chat-12-0123456789ab.kv", never by a path. The
store of KV files (kvstore.py), the index, the cache's figures and the backup use only this
interface; runtime.py picks the implementation ([cache] dir: the local folder, the only one
there is; the tests add one in memory).

What every implementation must hold to: put replaces a blob atomically (a reader sees the old
blob or the new one, never a part; a failed put leaves the old one, or none), get gives the
whole blob as a writable private copy or mapping (llama.cpp takes its bytes without a copy),
and a blob's `used_ns` time orders eviction (least recently used first: put and touch renew it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

from reame.config.files import atomic_file

TMP_PREFIX = "reame-kv-"  # a write in progress: TMP_PREFIX + random + ".tmp", in the folder
STALE_TMP_S = 600  # a temp file this old is no write under way


class BlobInfo(NamedTuple):
    """A blob as a listing shows it."""

    key: str
    size: int  # bytes
    used_ns: int  # when last written or touched (nanoseconds since the epoch)


class Blobs(ABC):
    """KV blobs by key. Keys are plain names (no "/"); every method may be called from any
    thread."""

    where: str = ""  # where the blobs are, in words (the Cache panel, logs)
    folder: Path | None = None  # the local folder holding them, if they are in one

    @abstractmethod
    def put(self, key: str, parts: Iterable[bytes | memoryview]) -> None:
        """Replace key's blob, atomically, by the parts one after another; OSError if the
        storage refused (then the old blob, or none, is there, and no partial one)."""

    @abstractmethod
    def get(self, key: str) -> mmap.mmap | None:
        """The whole blob, private and writable (closed by the caller); None if there is no
        blob; OSError if it cannot be read, ValueError if it is empty."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO | None:
        """The blob as a stream from its start, to read its head only (closed by the caller);
        None if there is no blob; OSError if it cannot be read."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The blob's bytes; None if there is no blob."""

    @abstractmethod
    def list(self) -> list[BlobInfo]:
        """Every blob there is."""

    @abstractmethod
    def touch(self, key: str) -> None:
        """Mark the blob used now (the last to be evicted); nothing if it is gone."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Delete the blob; False if there was none, or it cannot be deleted."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None


class FolderBlobs(Blobs):
    """Blobs as the files of a local folder: key = file name. A put writes a temporary file
    (TMP_PREFIX, fsynced) and renames it over the blob; a get maps the file. Files in the
    folder that are not blobs (other names) are listed too: the caller keeps to its own
    names, and never deletes another's."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.where = str(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{TMP_PREFIX}*.tmp"):
            # Left by a process that ended mid-write; a fresh one may be another process's
            # write under way (nodes sharing the folder).
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_TMP_S:
                    stale.unlink()

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key in (".", ".."):
            raise ValueError(f"not a blob's key: {key!r}")
        return self.folder / key

    def put(self, key: str, parts: Iterable[bytes | memoryview]) -> None:
        # Made again if lost: the folder is not synced (a turn would wait for it).
        with atomic_file(self._path(key), prefix=TMP_PREFIX, mode=0o600,
                         sync_folder=False) as f:
            for part in parts:
                f.write(part)

    def get(self, key: str) -> mmap.mmap | None:
        try:
            with self._path(key).open("rb") as f:
                # Private and writable: llama.cpp gets the bytes without a copy, and files
                # are only ever replaced (os.replace), never rewritten in place under a mapping.
                return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except FileNotFoundError:
            return None

    def open(self, key: str) -> BinaryIO | None:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def list(self) -> list[BlobInfo]:
        out = []
        for entry in os.scandir(self.folder):
            if entry.name.startswith(TMP_PREFIX) and entry.name.endswith(".tmp"):
                continue  # a write under way, not a blob yet
            try:
                # A symbolic link is never a file the folder's blobs wrote: its target's
                # content is not theirs (neither evicted, nor backed up).
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append(BlobInfo(entry.name, st.st_size, st.st_mtime_ns))
        return out

    def touch(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(key))

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except OSError:  # gone meanwhile, or not ours to delete
            return False
        return True


def open_blobs(folder: Path) -> Blobs:
    """The blobs [cache] dir names: a local folder (the one implementation there is)."""
    return FolderBlobs(folder)


def read_all(blobs: Blobs, key: str) -> bytes | None:
    """The whole blob as bytes (a small one: the totals); None if there is none."""
    stream = blobs.open(key)
    if stream is None:
        return None
    with stream:
        return stream.read()


__all__ = ["BlobInfo", "Blobs", "FolderBlobs", "STALE_TMP_S", "TMP_PREFIX",
           "open_blobs", "read_all"]
