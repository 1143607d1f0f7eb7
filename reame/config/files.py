"""Writing a file so that a crash or a power cut leaves the old file or the new one, never
half of one: a temp file beside it, flushed to disk, renamed over it (os.replace), and the
folder synced so that the rename itself survives a power cut. Every file Reame writes whole
goes through here: reame.conf, the users file, KV files, backups and their manifests."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

CHUNK = 1 << 20  # bytes read at a time when hashing


@contextmanager
def atomic_file(path: Path, *, text: bool = False, prefix: str | None = None,
                mode: int = 0o644, sync_folder: bool = True) -> Iterator[IO]:
    """A file to write that replaces path once the block ends without an exception (then
    path is the new file, on disk); on an exception path is untouched and the temp file gone.
    prefix: the temp file's name starts with it (a sweep can tell such files). mode: the new
    file's permissions (0o600 for secrets). sync_folder=False: the rename may be lost in a
    power cut (files that can be made again, such as KV files)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=prefix or f".{path.name}.",
                                suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_folder:
        sync(path.parent)


def write_atomically(path: Path, data: bytes | str, **options) -> None:
    """path holds data, whole, or is as it was (atomic_file's options)."""
    with atomic_file(path, text=isinstance(data, str), **options) as f:
        f.write(data)


def sync(path: Path) -> None:
    """fsync a file or a folder by its path (a folder: the names in it, such as a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
