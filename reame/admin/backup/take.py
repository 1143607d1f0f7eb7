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
    kv_files, left_out = _backup_kv(config.cache.dir, dest / KV_DIR)
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


def _backup_kv(folder: Path, target: Path) -> tuple[list[FileEntry], dict[str, str]]:
    """Copy Reame's files of the KV folder (not its temporary files, nor anything else), each
    checked whole; one that is not is left out, and named in the manifest (it is a cache: its
    chat's history is recomputed once)."""
    if not folder.is_dir():
        return [], {}
    target.mkdir(exist_ok=True)
    files, left_out = [], {}
    for path in sorted(folder.iterdir()):
        if not is_own_name(path.name):
            continue
        if path.is_symlink():  # never Reame's: its target's content is not the cache's
            left_out[f"{KV_DIR}/{path.name}"] = "a symbolic link, not a file Reame wrote"
            continue
        try:
            entry = _copy_file(path, target, path.name, "kv", prefix=KV_DIR)
        except FileNotFoundError:  # evicted, or its chat deleted, since the listing
            continue
        problem = (kvfile.problem(target / path.name)
                   if path.name not in (TOTALS_NAME, REPLIES_NAME) else None)
        if problem:
            (target / path.name).unlink()
            left_out[entry.path] = problem
        else:
            files.append(entry)
    return files, left_out


def _copy_file(source: Path, folder: Path, name: str, part: str, *, prefix: str = "",
               mode: int | None = None) -> FileEntry:
    """Copy source to folder/name, its SHA-256 taken on the way. Files are only ever replaced
    by a rename, so the copy is a whole file, the old or the new."""
    target = folder / name
    digest, size = hashlib.sha256(), 0
    with source.open("rb") as src, target.open("wb") as dst:
        # The source's own mode (KV files are 0600), unless told.
        os.fchmod(dst.fileno(), mode if mode is not None else stat.S_IMODE(os.fstat(
            src.fileno()).st_mode))
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())
        times = os.fstat(src.fileno())
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))  # the KV eviction order
    return FileEntry(f"{prefix}/{name}" if prefix else name, part, size, digest.hexdigest())
