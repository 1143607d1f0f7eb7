"""A second implementation of reame.inference.kv.blobs.Blobs, in memory, and the fixture that
runs a test module against each implementation.

MemoryBlobs keeps every blob as bytes in a dict; the blobs of one "folder" outlive the
service that wrote them (MEMORY, keyed by the folder the service was given), so that a new
Node over the same folder is a restart that finds them. A get gives a private, writable
anonymous mapping of a copy, as the folder's gives a private mapping of the file.

REAME_TEST_BLOBS picks the implementations a module that uses the kv_blobs fixture runs
against: "folder" (unset: the default), "memory", or "both".
"""

from __future__ import annotations

import io
import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from reame.inference.kv.blobs import BlobInfo, Blobs, FolderBlobs

MEMORY: dict[str, "MemoryBlobs"] = {}  # a folder -> its blobs, for the whole test process
_MEMORY_LOCK = threading.Lock()


class MemoryBlobs(Blobs):
    """Blobs in memory: key -> (bytes, last used in ns)."""

    def __init__(self, where: str = "memory"):
        self.where = f"memory:{where}"
        self._blobs: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def put(self, key: str, parts: Iterable[bytes | memoryview]) -> None:
        data = b"".join(bytes(part) for part in parts)  # whole before it is seen: atomic
        with self._lock:
            self._blobs[key] = (data, time.time_ns())

    def _data(self, key: str) -> bytes | None:
        with self._lock:
            found = self._blobs.get(key)
        return found[0] if found is not None else None

    def get(self, key: str) -> mmap.mmap | None:
        data = self._data(key)
        if data is None:
            return None
        if not data:
            raise ValueError("cannot map an empty blob")
        mapped = mmap.mmap(-1, len(data))  # anonymous: private to this reader, writable
        mapped.write(data)
        mapped.seek(0)
        return mapped

    def open(self, key: str) -> io.BytesIO | None:
        data = self._data(key)
        return io.BytesIO(data) if data is not None else None

    def size(self, key: str) -> int | None:
        data = self._data(key)
        return len(data) if data is not None else None

    def list(self) -> list[BlobInfo]:
        with self._lock:
            return [BlobInfo(key, len(data), used) for key, (data, used) in self._blobs.items()]

    def touch(self, key: str, when_ns: int | None = None) -> None:
        with self._lock:
            if key in self._blobs:
                self._blobs[key] = (self._blobs[key][0],
                                    time.time_ns() if when_ns is None else when_ns)

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._blobs.pop(key, None) is not None


def memory_blobs_at(folder: Path) -> MemoryBlobs:
    """The in-memory blobs standing for folder (the same ones at every call: a restart)."""
    with _MEMORY_LOCK:
        return MEMORY.setdefault(str(folder), MemoryBlobs(str(folder)))


class Backend:
    """One implementation, as a test sees it: the blobs of a folder, and what a test does to
    them from outside (damage a file, age it)."""

    def __init__(self, name: str):
        self.name = name

    def at(self, folder: Path) -> Blobs:
        return memory_blobs_at(folder) if self.name == "memory" else FolderBlobs(folder)

    def made(self, folder: Path) -> bool:
        """Whether any blobs were ever kept for folder (the cache was on)."""
        return str(folder) in MEMORY if self.name == "memory" else folder.exists()

    @staticmethod
    def read(blobs: Blobs, key: str) -> bytes:
        stream = blobs.open(key)
        assert stream is not None, f"no blob {key}"
        with stream:
            return stream.read()

    @staticmethod
    def set_used(blobs: Blobs, key: str, when: float) -> None:
        """Make key's blob last used at when (seconds since the epoch)."""
        if isinstance(blobs, MemoryBlobs):
            blobs.touch(key, int(when * 1e9))
        else:
            os.utime(blobs.folder / key, (when, when))


def _chosen() -> list[str]:
    chosen = os.environ.get("REAME_TEST_BLOBS", "folder")
    return ["folder", "memory"] if chosen == "both" else [chosen]


@pytest.fixture(params=_chosen())
def kv_blobs(request, monkeypatch) -> Iterator[Backend]:
    """The services a test builds (reame.runtime) keep their KV files in this implementation."""
    backend = Backend(request.param)
    if backend.name == "memory":
        monkeypatch.setattr("reame.inference.loading.open_blobs", memory_blobs_at)
    yield backend
    with _MEMORY_LOCK:
        MEMORY.clear()  # the test's "folders" are gone with it
