"""Putting a backup back: every file checked first, refused while a server uses the database,
what it replaces moved aside (never deleted), the database written last."""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from reame.admin.backup.manifest import (
    ASIDE,
    CONFIG_NAME,
    POSTGRESQL,
    SQLITE,
    BackupError,
    FileEntry,
    Manifest,
    RestoreReport,
    check_backup,
)
from reame.chats.store.sqlite_file import in_use
from reame.config.files import CHUNK, atomic_file
from reame.config.reame_conf import SETTINGS, Config, load_config
from reame.inference.kv.blobs import TMP_PREFIX


def restore(src: Path, config: Config, *, force: bool = False, with_config: bool = False,
            on_plan: Callable[[list[tuple[FileEntry, Path]]], object] | None = None
            ) -> RestoreReport:
    """Put the backup in src back where config says (with_config: where the backup's own
    config says, read as if it were at config.path, which it replaces).

    Every file is checked first; then refused if a server uses the database, or if there is
    data already (a database, KV files, an accounts file) unless force: then that is moved
    aside, never deleted. With with_config, every file must go inside the config's folder (an
    untrusted backup's config could point its accounts file at ~/.ssh/authorized_keys).
    on_plan is told every file and where it goes before anything is written. The database is
    written last."""
    manifest = check_backup(src)
    target = _backup_config(src, manifest, config) if with_config else config
    _check_same_kind(manifest, target)
    places = _places(manifest, target, config.path if with_config else None)
    if with_config:
        _check_inside(places, config.path.parent)
    if not target.storage.database_url:
        _check_not_in_use(target.storage.database_path)
    existing = _existing(target, manifest)
    if existing and not force:
        shown = ", ".join(str(p) for p in existing)
        raise BackupError(f"there is data already: {shown}. Restore with --force to move it "
                          f"aside (nothing is deleted)")
    if with_config and config.path.exists():
        existing.append(config.path)
    if on_plan is not None:
        on_plan(places)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = [(path, _move_aside(path, stamp)) for path in existing]
    written = sorted(places, key=lambda pair: pair[0].part == "database")  # the database last
    for entry, path in written:
        _install(src / entry.path, path, entry.part)
    return RestoreReport(manifest, written, moved)


def _check_inside(places: list[tuple[FileEntry, Path]], folder: Path) -> None:
    """Refuse a restore that would write outside folder (or through a link out of it)."""
    root = folder.resolve()
    for entry, path in places:
        if not path.parent.resolve().is_relative_to(root) or path.is_symlink():
            raise BackupError(
                f"the backup's config puts {entry.path} at {path}, outside {folder}: a restore "
                f"with --with-config writes only inside the config's folder. Restore without "
                f"--with-config, or correct the paths in the backup's {CONFIG_NAME}")


def _backup_config(src: Path, manifest: Manifest, config: Config) -> Config:
    """The backup's config as if its file were at config.path (the file it will replace)."""
    if not manifest.of_part("config"):
        raise BackupError(f"the backup {src} holds no config file: restore without "
                          f"--with-config")
    if config.path is None:
        raise BackupError("--with-config needs --config PATH: where to write the config")
    return _as_if_at(load_config(src / CONFIG_NAME), config.path)


def _as_if_at(config: Config, path: Path) -> Config:
    """config with its file at path: paths that were relative to its folder are now relative
    to path's folder (absolute ones stay)."""

    def moved(p: Path) -> Path:
        try:
            return path.parent / p.relative_to(config.base_dir)
        except ValueError:
            return p

    changes: dict[str, dict[str, Path]] = {}
    for item in SETTINGS:
        if item.kind is Path:
            value = getattr(getattr(config, item.section), item.key)
            changes.setdefault(item.section, {})[item.key] = moved(value)
    return replace(config, path=path, **{section: replace(getattr(config, section), **values)
                                         for section, values in changes.items()})


def _places(manifest: Manifest, target: Config,
            config_path: Path | None) -> list[tuple[FileEntry, Path]]:
    """Each file of the backup to restore, and where it goes (config_path: where the config
    file goes; None: it is not restored)."""
    places = []
    for entry in manifest.files:
        if entry.part == "database":
            places.append((entry, target.storage.database_path))
        elif entry.part == "kv":
            places.append((entry, target.cache.dir / entry.path.split("/", 1)[1]))
        elif entry.part == "accounts":
            if target.users_path is None:
                raise BackupError(
                    f"the backup holds an accounts file, but {target.path} has no [server] "
                    f"users_file: set one (e.g. users_file = users.json), or restore with "
                    f"--with-config; without accounts nobody could see the chats")
            places.append((entry, target.users_path))
        elif entry.part == "config" and config_path is not None:
            places.append((entry, config_path))
    return places


def _check_same_kind(manifest: Manifest, target: Config) -> None:
    """Refuse to restore chats kept in one kind of database into a config of the other: a
    SQLite file would be ignored by a server's config, and a backup of a server's holds no
    database for a config that wants the file."""
    if manifest.database == SQLITE and target.storage.database_url:
        raise BackupError("this backup's chats are in a SQLite file, but the config keeps them "
                          "in PostgreSQL ([storage] database_url): restore with a config "
                          "without database_url")
    if manifest.database == POSTGRESQL and not target.storage.database_url:
        raise BackupError("this backup holds no database: its chats were in PostgreSQL, which "
                          "pg_dump backs up. Restore with a config whose [storage] "
                          "database_url names that server, and the database with pg_restore")


def _check_not_in_use(database: Path) -> None:
    """Refuse while another connection holds the database open (a running server keeps its
    connections open): an exclusive lock cannot be had then."""
    if not database.is_file():
        return
    if in_use(database):
        raise BackupError(f"{database} is in use (is a Reame server running on it?): "
                          f"stop the server, then restore")
    # anything else (not a database at all, say): it is moved aside like any other file


def _existing(target: Config, manifest: Manifest) -> list[Path]:
    """The data restore would replace: the database with its WAL files (a WAL left beside the
    restored database would be replayed into it), a KV folder that holds anything, the
    accounts file if the backup has one. (A server's database is not the restore's.)"""
    database = target.storage.database_path
    found = [] if target.storage.database_url else [
        p for p in (database, database.with_name(database.name + "-wal"),
                    database.with_name(database.name + "-shm")) if p.exists()]
    kv = target.cache.dir
    if kv.is_dir() and any(kv.iterdir()):
        found.append(kv)
    if manifest.of_part("accounts") and target.users_path.exists():
        found.append(target.users_path)
    return found


def _move_aside(path: Path, stamp: str) -> Path:
    aside = path.with_name(f"{path.name}.{ASIDE}-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{ASIDE}-{stamp}-{n}")
    os.rename(path, aside)
    return aside


def _install(source: Path, target: Path, part: str) -> None:
    """Copy source to target through a temporary file beside it, then a rename: an interrupted
    restore leaves no partial file (in the KV folder, one of the kind the server clears at
    start). The database and the accounts file are made 0600; the others keep their mode."""
    target.parent.mkdir(parents=True, exist_ok=True)
    times = source.stat()
    mode = 0o600 if part in ("database", "accounts") else stat.S_IMODE(times.st_mode)
    prefix = TMP_PREFIX if part == "kv" else f".{target.name}."
    with atomic_file(target, prefix=prefix, mode=mode) as dst, source.open("rb") as src:
        shutil.copyfileobj(src, dst, CHUNK)
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))


# files
