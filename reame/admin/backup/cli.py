"""`python app.py backup DIR` and `python app.py restore DIR`: their arguments and what they
say."""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from reame.admin.backup.manifest import POSTGRESQL, SQLITE, BackupError, FileEntry
from reame.admin.backup.restore import restore
from reame.admin.backup.take import backup
from reame.config.reame_conf import Config, ConfigError, load_config


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
