"""A backup folder's manifest: what it holds (each file's part, size and SHA-256), written
last; reading and checking it before a restore touches anything."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reame.config.files import sha256_of, sync, write_atomically
from reame.inference.kv.kvstore import is_own_name

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
class RestoreReport:
    """What a restore wrote (each file, and where) and what it moved aside (old -> new)."""

    manifest: Manifest
    written: list[tuple[FileEntry, Path]]
    moved_aside: list[tuple[Path, Path]]


def write_manifest(dest: Path, manifest: Manifest) -> None:
    """The manifest, last and atomically, after every file and folder is on disk."""
    for folder in {dest, dest / KV_DIR}:
        if folder.is_dir():
            sync(folder)
    write_atomically(dest / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=1) + "\n")


def check_backup(src: Path) -> Manifest:
    """The backup's manifest, once every file it lists is there, expected, and has its size
    and SHA-256; BackupError naming the first that does not."""
    manifest = read_manifest(src)
    seen: set[str] = set()
    for entry in manifest.files:
        expected = part_of(entry.path)
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


def part_of(path: str) -> str | None:
    """The part a file of a backup belongs to, by its path; None: no file a backup holds (a
    manifest cannot send a restore elsewhere)."""
    if path in _PART_OF_NAME:
        return _PART_OF_NAME[path]
    folder, _, name = path.partition("/")
    if folder == KV_DIR and is_own_name(name):
        return "kv"
    return None


def entry_of(path: Path, name: str, part: str) -> FileEntry:
    return FileEntry(name, part, path.stat().st_size, sha256_of(path))


# command line
