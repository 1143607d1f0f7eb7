"""`python app.py backup DIR` and `python app.py restore DIR`: a copy of a Reame's data taken
while it serves, and putting one back.

A backup folder holds:

    reame.db        the database: a consistent snapshot (SQLite's online backup API)
    kv/             the KV files and the cache's totals, each file checked whole
    users.json      the accounts file, mode 0600 (if [server] users_file is set)
    reame.conf      the config file
    manifest.json   written last: every file's part, size and SHA-256

With [storage] database_url the chats are in PostgreSQL: a backup then holds everything but
the database (its manifest says so), which is PostgreSQL's own tools' to copy (pg_dump, and
pg_restore to put it back); backup and restore say so when they finish.

A folder without manifest.json is a backup that did not finish: restore refuses it. Restore
checks every file against the manifest before it touches anything, and refuses while a process
(a running server) has the target database open. It never deletes: what it replaces is moved
aside (`<name>.before-restore-<time>`), and only with force. The config file comes back only
when asked (with_config): a new machine usually keeps its own paths and port; then the data go
where the backup's config says, read as if it were the target's file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import reame.inference.kv.kvfile as kvfile
from reame import __version__
from reame.config.files import CHUNK, atomic_file, sha256_of, sync, write_atomically
from reame.config.reame_conf import SETTINGS, Config, ConfigError, load_config
from reame.inference.kv.kvfile import TMP_PREFIX
from reame.inference.kv.kvstore import TOTALS_NAME, is_own_name

FORMAT = 1  # of the backup folder and its manifest
MANIFEST_NAME = "manifest.json"
DB_NAME = "reame.db"
KV_DIR = "kv"
ACCOUNTS_NAME = "users.json"
CONFIG_NAME = "reame.conf"
ASIDE = "before-restore"  # what restore moves aside is named <name>.before-restore-<time>
SQLITE, POSTGRESQL = "sqlite", "postgresql"  # where a backup's chats are (Manifest.database)


class BackupError(Exception):
    """A backup or a restore refused; the message says why. The server's data, and the data a
    restore would replace, are as they were."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a backup: its path in the folder (POSIX, relative), its part, size, SHA-256."""

    path: str
    part: str
    size: int
    sha256: str


@dataclass
class Manifest:
    """What a backup folder holds, and the KV files left out of it (path -> why)."""

    reame_version: str
    created_at: str  # ISO 8601, UTC
    files: list[FileEntry]
    left_out: dict[str, str] = field(default_factory=dict)
    # Where the chats were: SQLITE (the database is in the backup) or POSTGRESQL (it is not).
    database: str = SQLITE

    def of_part(self, part: str) -> list[FileEntry]:
        return [entry for entry in self.files if entry.part == part]

    def to_json(self) -> dict:
        return {"format": FORMAT, "reame_version": self.reame_version,
                "created_at": self.created_at,
                "files": [asdict(entry) for entry in self.files], "left_out": self.left_out,
                "database": self.database}

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        """The manifest in data; BackupError if it is not one this Reame reads."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise BackupError(f"backup format {found!r}: this Reame reads format {FORMAT}")
        try:
            files = [FileEntry(str(f["path"]), str(f["part"]), int(f["size"]), str(f["sha256"]))
                     for f in data["files"]]
            return cls(str(data["reame_version"]), str(data["created_at"]), files,
                       dict(data.get("left_out") or {}), str(data.get("database", SQLITE)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackupError(f"{MANIFEST_NAME} is malformed ({exc!r})") from None


@dataclass
class Restored:
    """What a restore wrote (each file, and where) and what it moved aside (old -> new)."""

    manifest: Manifest
    written: list[tuple[FileEntry, Path]]
    moved_aside: list[tuple[Path, Path]]


# backup


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
    _write_manifest(dest, manifest)
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
    src = sqlite3.connect(source.resolve().as_uri() + "?mode=rw", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.execute("BEGIN")
        src.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot starts here
        src.backup(dst, pages=pages, progress=progress)
        src.rollback()
        # The server's database is in WAL mode; the copy is one file, nothing beside it.
        dst.execute("PRAGMA journal_mode=DELETE").fetchone()
        check = dst.execute("PRAGMA quick_check").fetchone()[0]
    finally:
        src.close()
        dst.close()
    if check != "ok":
        raise BackupError(f"the copy of {source} fails SQLite's quick_check ({check}): "
                          f"the database itself may be damaged")
    sync(target)
    return _entry(target, DB_NAME, "database")


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
        problem = kvfile.problem(target / path.name) if path.name != TOTALS_NAME else None
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


def _write_manifest(dest: Path, manifest: Manifest) -> None:
    """The manifest, last and atomically, after every file and folder is on disk."""
    for folder in {dest, dest / KV_DIR}:
        if folder.is_dir():
            sync(folder)
    write_atomically(dest / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=1) + "\n")


# restore


def check_backup(src: Path) -> Manifest:
    """The backup's manifest, once every file it lists is there, expected, and has its size
    and SHA-256; BackupError naming the first that does not."""
    manifest = read_manifest(src)
    seen: set[str] = set()
    for entry in manifest.files:
        expected = _part_of(entry.path)
        if expected != entry.part or entry.path in seen:
            raise BackupError(f"{MANIFEST_NAME} in {src} lists an unexpected file {entry.path!r}")
        seen.add(entry.path)
        path = src / entry.path
        folders = [src / part for part in Path(entry.path).parents if part != Path(".")]
        if path.is_symlink() or any(folder.is_symlink() for folder in folders):
            raise BackupError(f"{entry.path} in the backup {src} is a symbolic link: a backup "
                              f"holds files only; nothing restored")
        if not path.is_file():
            raise BackupError(f"{entry.path} is missing from the backup {src}: nothing restored")
        if path.stat().st_size != entry.size or sha256_of(path) != entry.sha256:
            raise BackupError(f"{entry.path} in the backup {src} is damaged (its SHA-256 "
                              f"differs from the manifest's): nothing restored")
    expected_databases = 1 if manifest.database == SQLITE else 0
    if len(manifest.of_part("database")) != expected_databases:
        raise BackupError(f"{MANIFEST_NAME} in {src} lists {'no' if expected_databases else 'a'}"
                          f" database")
    return manifest


def read_manifest(src: Path) -> Manifest:
    """The manifest of the backup in src, unchecked; BackupError if there is none."""
    path = src / MANIFEST_NAME
    if not src.is_dir():
        raise BackupError(f"{src} is not a folder")
    if not path.is_file():
        raise BackupError(f"{src} has no {MANIFEST_NAME}: not a Reame backup, or one that did "
                          f"not finish")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path} is unreadable: {exc}") from None
    return Manifest.from_json(data)


_PART_OF_NAME = {DB_NAME: "database", ACCOUNTS_NAME: "accounts", CONFIG_NAME: "config"}


def _part_of(path: str) -> str | None:
    """The part a file of a backup belongs to, by its path; None: no file a backup holds (a
    manifest cannot send a restore elsewhere)."""
    if path in _PART_OF_NAME:
        return _PART_OF_NAME[path]
    folder, _, name = path.partition("/")
    if folder == KV_DIR and is_own_name(name):
        return "kv"
    return None


def restore(src: Path, config: Config, *, force: bool = False, with_config: bool = False,
            on_plan: Callable[[list[tuple[FileEntry, Path]]], object] | None = None
            ) -> Restored:
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
    return Restored(manifest, written, moved)


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
    conn = sqlite3.connect(database, timeout=0)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # set first: then the lock is the file's
        conn.execute("BEGIN EXCLUSIVE")
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorname in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            raise BackupError(f"{database} is in use (is a Reame server running on it?): "
                              f"stop the server, then restore") from None
        # anything else (not a database at all, say): it is moved aside like any other file
    finally:
        conn.close()


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


def _entry(path: Path, name: str, part: str) -> FileEntry:
    return FileEntry(name, part, path.stat().st_size, sha256_of(path))


# command line


def run_backup(argv: list[str], default_config: Path) -> int:
    """`python app.py backup DIR [--config PATH]`; argv: what follows `backup`."""
    parser = argparse.ArgumentParser(
        prog="python app.py backup",
        description="Copy the database, the KV files, the accounts file and reame.conf into "
                    "DIR, safely while the server runs.")
    parser.add_argument("dest", metavar="DIR", type=Path, help="a new or empty folder")
    parser.add_argument("--config", type=Path, default=default_config)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        manifest = backup(load_config(args.config), args.dest)
    except (BackupError, ConfigError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:
        print(f"reame: the backup failed: {exc}. {args.dest} has no manifest and cannot be "
              f"restored: delete it", file=sys.stderr)
        return 1
    print(f"backed up to {args.dest} in {time.perf_counter() - started:.1f} s: "
          f"{_summary(manifest.files, manifest.database)}")
    for path, why in manifest.left_out.items():
        print(f"left out {path}: {why} (only a cache: that chat's history is recomputed "
              f"at its next turn)")
    if manifest.database == POSTGRESQL:
        url = _shown_url(load_config(args.config).storage.database_url)
        print(f"the chats are in PostgreSQL ([storage] database_url), not in {args.dest}: back "
              f"them up with pg_dump, e.g.\n"
              f"    pg_dump --format=custom --file=reame.pgdump '{url}'")
    return 0


def run_restore(argv: list[str], default_config: Path) -> int:
    """`python app.py restore DIR [--config PATH] [--force] [--with-config]`; argv: what
    follows `restore`."""
    parser = argparse.ArgumentParser(
        prog="python app.py restore",
        description="Put a backup back where reame.conf says. Stop the server first.")
    parser.add_argument("src", metavar="DIR", type=Path, help="a folder `backup` made")
    parser.add_argument("--config", type=Path, default=default_config)
    parser.add_argument("--force", action="store_true",
                        help="move the data already there aside (never deleted) and restore")
    parser.add_argument("--with-config", action="store_true",
                        help="also restore reame.conf at --config (the old one moved aside) "
                             "and put the data where it says")
    args = parser.parse_args(argv)
    try:
        restored = restore(args.src, _target_config(args.config, args.with_config),
                           force=args.force, with_config=args.with_config, on_plan=_say_plan)
    except (BackupError, ConfigError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:
        print(f"reame: the restore failed: {exc}. Run it again with --force", file=sys.stderr)
        return 1
    manifest = restored.manifest
    print(f"restored from {args.src} (made {manifest.created_at} by Reame "
          f"{manifest.reame_version}): "
          f"{_summary([entry for entry, _ in restored.written], manifest.database)}")
    for old, new in restored.moved_aside:
        print(f"moved aside: {old} -> {new}")
    if manifest.database == POSTGRESQL:
        print("the chats are in PostgreSQL, not in a backup: put them back with pg_restore "
              "(every node stopped), e.g.\n"
              "    pg_restore --clean --if-exists --dbname='postgresql://...' reame.pgdump")
    return 0


def _say_plan(places: list[tuple[FileEntry, Path]]) -> None:
    """What a restore will write, before it writes it."""
    folders: dict[Path, list[str]] = {}
    for _, path in places:
        folders.setdefault(path.parent, []).append(path.name)
    for folder, names in folders.items():
        print(f"will write into {folder}: "
              + (", ".join(names) if len(names) <= 3 else f"{len(names):,} files"))
    sys.stdout.flush()


def _target_config(path: Path, with_config: bool) -> Config:
    """The config restore writes by; with --with-config the file may not exist yet (a new
    machine): only its path counts then."""
    if with_config and not path.exists():
        return replace(load_config(None), path=path.resolve())
    return load_config(path)


def _shown_url(url: str) -> str:
    """A database_url as PostgreSQL's own tools take it (postgresql://, no driver name), without
    its password (they read it from ~/.pgpass or PGPASSWORD, or ask)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    netloc = f"{user}@{host}" if user else host
    return urlunsplit(("postgresql", netloc, parts.path, parts.query, parts.fragment))


def _summary(files: list[FileEntry], database_kind: str = SQLITE) -> str:
    """How many files and bytes, part by part: "3 files, 1.2 MB (the database: 1.1 MB; ...)"."""
    kv = [entry for entry in files if entry.part == "kv"]
    database = sum(entry.size for entry in files if entry.part == "database")
    shown = _mb(database) if database_kind == SQLITE else "in PostgreSQL, not here"
    parts = [f"the database: {shown}",
             f"{len(kv)} KV file{'' if len(kv) == 1 else 's'}: {_mb(sum(e.size for e in kv))}"]
    parts += [f"the {part} file" for part in ("accounts", "config")
              if any(entry.part == part for entry in files)]
    total = sum(entry.size for entry in files)
    return f"{len(files)} files, {_mb(total)} ({'; '.join(parts)})"


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB"
