"""Taking a backup while the server runs: a snapshot of the SQLite database, the KV files
(each checked whole), the accounts and config files; the manifest last."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import reame.inference.kv.kvfile as kvfile
from reame import __version__
from reame.admin.backup.manifest import (
    ACCOUNTS_NAME,
    CONFIG_NAME,
    DB_NAME,
    KV_DIR,
    POSTGRESQL,
    SQLITE,
    BackupError,
    FileEntry,
    Manifest,
    entry_of,
    write_manifest,
)
from reame.chats.store.sqlite_file import snapshot
from reame.config.files import CHUNK, sync
from reame.config.reame_conf import Config
from reame.inference.kv.blobs import BlobInfo, Blobs, FolderBlobs, open_blobs
from reame.inference.kv.kvstore import REPLIES_NAME, TOTALS_NAME, is_own_name


def backup(config: Config, dest: Path, *, pages: int = -1,
           progress: Callable[[int, int, int], object] | None = None) -> Manifest:
    """Copy config's database, KV files, accounts file and config file into dest (new or
    empty), safely while the server runs; manifest.json last. pages, progress: the database
    copy's steps, as sqlite3.Connection.backup takes them (-1: one step). With a
    database_url, everything but the database (pg_dump's to copy)."""
    database = config.storage.database_path
    on_server = bool(config.storage.database_url)
    if not on_server and not database.is_file():
        raise BackupError(f"no database at {database}: nothing to back up "
                          f"(is --config the server's?)")
    _check_destination(dest, config)
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = [] if on_server else [_copy_database(database, dest, pages=pages,
                                                 progress=progress)]
    kv_files, left_out = (_backup_kv(open_blobs(config.cache.dir), dest / KV_DIR)
                          if config.cache.dir.is_dir() else ([], {}))
    files += kv_files
    if config.users_path is not None and config.users_path.is_file():
        files.append(_copy_file(config.users_path, dest, ACCOUNTS_NAME, "accounts", mode=0o600))
    if config.path is not None and config.path.is_file():
        files.append(_copy_file(config.path, dest, CONFIG_NAME, "config"))
    manifest = Manifest(__version__, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        files, left_out, POSTGRESQL if on_server else SQLITE)
    write_manifest(dest, manifest)
    return manifest


def _check_destination(dest: Path, config: Config) -> None:
    """Refuse a destination that holds anything, or lies in the KV folder (which must hold
    only Reame's files: kvstore.check_folder)."""
    if dest.exists() and not dest.is_dir():
        raise BackupError(f"{dest} is a file: back up into a new or empty folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise BackupError(f"{dest} is not empty: back up into a new or empty folder")
    if dest.resolve().is_relative_to(config.cache.dir.resolve()):
        raise BackupError(f"{dest} is inside the KV folder {config.cache.dir}: "
                          f"back up somewhere else")


def _copy_database(source: Path, folder: Path, *, pages: int,
                   progress: Callable[[int, int, int], object] | None) -> FileEntry:
    """A consistent snapshot of the live database in folder, as one self-contained file.

    A read transaction is held on the source for the whole copy: in WAL mode the server keeps
    writing meanwhile, and the copy, whatever its steps, is the database as it was when the
    copy began (without it, a write by another connection restarts the copy at its next step,
    which a busy server could do forever)."""
    target = folder / DB_NAME
    target.touch(mode=0o600)  # chats are private: never readable by others, even half-copied
    check = snapshot(source, target, pages=pages, progress=progress)
    if check != "ok":
        raise BackupError(f"the copy of {source} fails SQLite's quick_check ({check}): "
                          f"the database itself may be damaged")
    sync(target)
    return entry_of(target, DB_NAME, "database")


def _backup_kv(blobs: Blobs, target: Path) -> tuple[list[FileEntry], dict[str, str]]:
    """Copy Reame's blobs of the KV cache (blobs.py: not the folder's temporary files, nor
    anything else, nor symbolic links) as files of target, each checked whole; one that is
    not is left out, and named in the manifest (it is a cache: its chat's history is
    recomputed once)."""
    target.mkdir(exist_ok=True)
    copies = FolderBlobs(target)
    files, left_out = [], {}
    for blob in sorted(blobs.list()):
        if not is_own_name(blob.key):
            continue
        entry = _copy_blob(blobs, blob, target)
        if entry is None:  # evicted, or its chat deleted, since the listing
            continue
        problem = (kvfile.problem(copies, blob.key)
                   if blob.key not in (TOTALS_NAME, REPLIES_NAME) else None)
        if problem:
            copies.delete(blob.key)
            left_out[entry.path] = problem
        else:
            files.append(entry)
    return files, left_out


def _copy_blob(blobs: Blobs, blob: BlobInfo, folder: Path) -> FileEntry | None:
    """Copy a blob to folder/its key, as _copy_file copies a file (0600, as the KV folder's
    files are; its last use kept: the eviction order); None if it is gone."""
    source = blobs.open(blob.key)
    if source is None:
        return None
    with source:
        entry = _copy_stream(source, folder / blob.key, blob.key, "kv", prefix=KV_DIR,
                             mode=0o600)
    os.utime(folder / blob.key, ns=(blob.used_ns, blob.used_ns))
    return entry


def _copy_file(source: Path, folder: Path, name: str, part: str, *, prefix: str = "",
               mode: int | None = None) -> FileEntry:
    """Copy source to folder/name, its SHA-256 taken on the way. Files are only ever replaced
    by a rename, so the copy is a whole file, the old or the new."""
    target = folder / name
    with source.open("rb") as src:
        # The source's own mode, unless told.
        entry = _copy_stream(src, target, name, part, prefix=prefix, mode=(
            mode if mode is not None else stat.S_IMODE(os.fstat(src.fileno()).st_mode)))
        times = os.fstat(src.fileno())
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
    return entry


def _copy_stream(src, target: Path, name: str, part: str, *, prefix: str,
                 mode: int) -> FileEntry:
    """Copy src into the new file target (mode), its SHA-256 taken on the way."""
    digest, size = hashlib.sha256(), 0
    with target.open("wb") as dst:
        os.fchmod(dst.fileno(), mode)
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    return FileEntry(f"{prefix}/{name}" if prefix else name, part, size, digest.hexdigest())
