"""The SQLite database as a file, for backup and restore: a consistent copy taken while the
server writes, and whether a process has it open."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path


def snapshot(source: Path, target: Path, *, pages: int,
             progress: Callable[[int, int, int], object] | None) -> str:
    """Copy the live database at source into target (an empty file), as one self-contained
    file; SQLite's quick_check of the copy ("ok" if whole).

    A read transaction is held on the source for the whole copy: in WAL mode the server keeps
    writing meanwhile, and the copy, whatever its steps, is the database as it was when the
    copy began (without it, a write by another connection restarts the copy at its next step,
    which a busy server could do forever). pages, progress: as sqlite3.Connection.backup
    takes them."""
    src = sqlite3.connect(source.resolve().as_uri() + "?mode=rw", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.execute("BEGIN")
        src.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot starts here
        src.backup(dst, pages=pages, progress=progress)
        src.rollback()
        # The server's database is in WAL mode; the copy is one file, nothing beside it.
        dst.execute("PRAGMA journal_mode=DELETE").fetchone()
        return dst.execute("PRAGMA quick_check").fetchone()[0]
    finally:
        src.close()
        dst.close()


def in_use(database: Path) -> bool:
    """Whether another connection holds the database open (a running server keeps its
    connections open): an exclusive lock cannot be had then. False for a file that is not a
    database."""
    if not database.is_file():
        return False
    conn = sqlite3.connect(database, timeout=0)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # set first: then the lock is the file's
        conn.execute("BEGIN EXCLUSIVE")
    except sqlite3.DatabaseError as exc:
        return exc.sqlite_errorname in ("SQLITE_BUSY", "SQLITE_LOCKED")
    finally:
        conn.close()
    return False
