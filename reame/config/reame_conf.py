"""reame.conf <-> frozen dataclasses. The only module that knows the file format.

Every setting is declared once in SETTINGS with its type, default, allowed range and help; the
pydantic model generated from a section's declarations checks its values.
Relative paths are resolved against the folder of the config file.
"""

from __future__ import annotations

import ast
import configparser
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reame.config.chat_settings import FIELDS, ChatSettings
from reame.config.files import write_atomically
from reame.config.setting import Setting, settings_model


class ConfigError(Exception):
    """reame.conf cannot be read or holds a bad value."""


SETTINGS: tuple[Setting, ...] = (
    Setting("model", "model_path", Path, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
            "GGUF model file; relative to this file's folder"),
    Setting("model", "models_dir", Path, "models",
            "folder of GGUF files: the Settings tab lists them, `pull` downloads into it"),
    Setting("model", "n_ctx", int, 4096, "context window in tokens (prompt + reply)", 256, 131072),
    Setting("model", "n_threads", int, 0, "CPU threads for inference; 0 = all cores", 0, 512),
    Setting("model", "slots", int, 4, "replies written at once, each with n_ctx tokens of KV "
            "in memory; more people wait in line", 1, 64),
    Setting("model", "kv_ram_mb", int, 2048, "memory the slots' KV may take in MB; fewer "
            "slots are used if they do not fit", 16, 10_000_000),
    Setting("model", "exact_under_load", bool, False,
            "decode each reply's next token on its own, as if alone, when several replies are "
            "written at once (bit-identical replies under load, slower); false = together"),
    Setting("model", "mmap", str, "auto",
            "map the model file (true) or read it into memory (false); auto = read it where "
            "llama.cpp repacks some of its weights for this CPU, which a mapped file would hold "
            "twice, map it otherwise", choices=("auto", "true", "false")),
    Setting("model", "flash_attn", str, "auto",
            "llama.cpp's flash attention: auto = on for models whose attention heads are 128 "
            "wide or more (faster there on CPUs; slower for 64-wide heads), and always with a "
            "q8_0 KV cache, which needs it", choices=("auto", "true", "false")),
    Setting("model", "engine_process", bool, True,
            "run the model in a process of its own: a fatal error inside llama.cpp ends the "
            "turns under way and the model is loaded again, while the server and its pages "
            "live on; false = in the server's process"),
    # The defaults of new chats: a chat's own settings, declared in chat_settings.py.
    *FIELDS,
    Setting("server", "host", str, "127.0.0.1", "address to listen on"),
    Setting("server", "port", int, 7860, "port to listen on", 1, 65535),
    Setting("server", "users_file", str, "",
            "accounts (users, password hashes, API keys); empty = no accounts"),
    Setting("server", "allow_anonymous", bool, False,
            "listen on another address than this machine without accounts"),
    Setting("server", "allowed_hosts", str, "",
            "other host names the server answers to (comma-separated); on 127.0.0.1 only "
            "localhost names are answered otherwise, elsewhere any"),
    Setting("server", "allowed_origins", str, "",
            "other web origins whose pages may call the server (comma-separated, e.g. "
            "https://example.org); empty = only the server's own page"),
    Setting("server", "max_waiting", int, 16, "turns that may wait for a free slot; beyond, "
            "/v1 answers 429 and the page says the server is full", 0, 100_000),
    Setting("server", "stalled_reply_s", int, 10,
            "a client that reads nothing of its reply for this many seconds (hung up, stopped "
            "reading) is gone: its reply stops and its slot is free", 1, 3600),
    Setting("server", "user_share", float, 0.5,
            "with accounts, the share of the slots, and of the waiting line, that one user or "
            "API key may hold at once", 0.0, 1.0, low_open=True),
    Setting("server", "trusted_proxies", str, "",
            "addresses of reverse proxies (comma-separated, e.g. 127.0.0.1) whose "
            "X-Forwarded-For and X-Forwarded-Proto are believed; empty = none"),
    Setting("server", "max_upload_mb", int, 64,
            "largest file the page takes (an import of chats, a document) in MB; other kinds are refused",
            1, 4096),
    Setting("server", "warm_up", bool, True,
            "run the model once (one slot) at start, before /health says ok"),
    Setting("server", "model_titles", bool, True,
            "after a chat's first reply the model writes its title, while no reply is "
            "written; false = the first words of the first message"),
    Setting("server", "root_path", str, "",
            "the path a reverse proxy serves Reame under (e.g. /reame); empty = the root"),
    Setting("storage", "sessions_dir", Path, "sessions",
            "folder for reame.db (SQLite) and the KV files"),
    Setting("storage", "database_url", str, "",
            "PostgreSQL server several Reame nodes share, postgresql://USER:PASSWORD@HOST:PORT/"
            "DATABASE; empty = the SQLite file reame.db in sessions_dir"),
    Setting("storage", "max_chats_per_user", int, 5000,
            "most chats one user may keep; a new one beyond is refused", 1, 10_000_000),
    Setting("cache", "enabled", bool, True, "keep each chat's KV cache on disk and restore it"),
    Setting("cache", "dir", Path, "sessions/kv", "folder of the KV files"),
    Setting("cache", "max_disk_mb", int, 4096,
            "disk budget of the KV files in MB; least recently used go first", 16, 10_000_000),
    Setting("cache", "kv_type", str, "f16", "KV cache type: f16, or q8_0 (half the size)",
            choices=("f16", "q8_0")),
    Setting("cache", "exact", bool, False,
            "reuse cached KV only where the reply stays the one a cold start gives, bit for "
            "bit (whole 128-token chunks of a prompt; docs/cache.md); false = reuse every "
            "token a prompt shares with the cache, as llama-server does (faster; at a near "
            "tie a reply may differ)"),
)


@dataclass(frozen=True)
class ModelConfig:
    model_path: Path
    models_dir: Path
    n_ctx: int
    n_threads: int
    slots: int
    kv_ram_mb: int
    exact_under_load: bool
    mmap: str
    flash_attn: str
    engine_process: bool = True

    @property
    def kv_ram_bytes(self) -> int:
        return self.kv_ram_mb << 20


GenerationConfig = ChatSettings  # [generation]: the settings of new chats


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})  # this machine's own names


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    users_file: str
    allow_anonymous: bool
    allowed_hosts: str
    allowed_origins: str
    max_waiting: int
    stalled_reply_s: int
    user_share: float
    trusted_proxies: str
    max_upload_mb: int
    warm_up: bool
    model_titles: bool
    root_path: str

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb << 20

    @property
    def public_root(self) -> str:
        """root_path as "/a/b" (no trailing slash), or "" for the root."""
        path = self.root_path.strip().strip("/")
        return f"/{path}" if path else ""

    @property
    def local_only(self) -> bool:
        return self.host in LOOPBACK_NAMES

    @property
    def allowed_host_names(self) -> frozenset[str] | None:
        """The Host names served: on a loopback address the loopback names and the configured
        ones (DNS rebinding); elsewhere the configured ones, or any (None) if there are none."""
        names = frozenset(_items(self.allowed_hosts.lower()))
        if self.local_only:
            return names | LOOPBACK_NAMES
        return names or None

    @property
    def allowed_origin_list(self) -> frozenset[str]:
        return frozenset(_items(self.allowed_origins))


DATABASE_FILE = "reame.db"  # the SQLite file's name, in sessions_dir


@dataclass(frozen=True)
class StorageConfig:
    sessions_dir: Path
    database_url: str
    max_chats_per_user: int

    @property
    def database_path(self) -> Path:
        """The SQLite file (the database unless database_url names a server)."""
        return self.sessions_dir / DATABASE_FILE

    @property
    def database(self) -> Path | str:
        """What the store opens: the server's URL, or the SQLite file (a Path)."""
        return self.database_url or self.database_path


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool
    dir: Path
    max_disk_mb: int
    kv_type: str
    exact: bool

    @property
    def max_disk_bytes(self) -> int:
        return self.max_disk_mb << 20


@dataclass(frozen=True)
class Config:
    model: ModelConfig
    generation: GenerationConfig
    server: ServerConfig
    storage: StorageConfig
    cache: CacheConfig
    path: Path | None = None

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    @property
    def users_path(self) -> Path | None:
        """The accounts file, resolved against the config's folder; None: no accounts."""
        raw = self.server.users_file.strip()
        if not raw:
            return None
        path = Path(os.path.expanduser(raw))
        return path if path.is_absolute() else self.base_dir / path


_SECTIONS = {
    "model": ModelConfig,
    "generation": GenerationConfig,
    "server": ServerConfig,
    "storage": StorageConfig,
    "cache": CacheConfig,
}


_BOOLEANS = configparser.ConfigParser.BOOLEAN_STATES  # 1/0, yes/no, true/false, on/off


DATABASE_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def _database_url(where: str, raw: str) -> str:
    """A PostgreSQL URL, or "" (the SQLite file). The error names the scheme only: the rest
    may hold a password."""
    url = raw.strip()
    scheme, found, _ = url.partition("://")
    if url and not (found and scheme.lower() in DATABASE_SCHEMES):
        seen = f"this one starts with {scheme}://" if found else "this one has no scheme://"
        raise ConfigError(f"{where}: expected a PostgreSQL URL, postgresql://USER:PASSWORD@HOST"
                          f":PORT/DATABASE, or nothing for the SQLite file; {seen}")
    return url


# Settings whose text must have a shape: (section, key) -> check(where, raw) -> value.
_TEXT_CHECKS = {("storage", "database_url"): _database_url}


def _convert(setting: Setting, raw: str, base_dir: Path) -> Any:
    """The text of a setting as its value: read as configparser reads the kind (int(), float(),
    its booleans), then checked by the pydantic model generated from the section's declarations
    (range, choices)."""
    where = f"[{setting.section}] {setting.key}"
    if setting.kind is Path:
        if not raw.strip():
            raise ConfigError(f"{where}: a path is required")
        path = Path(os.path.expanduser(raw.strip()))
        return path if path.is_absolute() else (base_dir / path)
    if setting.kind is bool:
        if raw.strip().lower() not in _BOOLEANS:
            raise ConfigError(f"{where} = {raw!r}: expected true or false")
        return _BOOLEANS[raw.strip().lower()]
    if setting.kind is str:
        check = _TEXT_CHECKS.get((setting.section, setting.key))
        value = check(where, raw) if check else raw.strip() if setting.choices else raw
    else:
        try:
            value = setting.kind(raw)
        except ValueError:
            raise ConfigError(f"{where} = {raw!r}: expected {setting.kind.__name__}") from None
        if not math.isfinite(value):  # "nan" and "inf" read as floats: no setting means them
            raise ConfigError(f"{where} = {raw!r}: expected a finite number")
    section = tuple(item for item in SETTINGS if item.section == setting.section)
    try:
        settings_model(setting.section, section).model_validate({setting.key: value})
    except ValidationError:
        if setting.choices:
            raise ConfigError(f"{where} = {raw!r}: expected one of "
                              f"{', '.join(setting.choices)}") from None
        low, high = setting.minimum, setting.maximum
        raise ConfigError(f"{where} = {value}: allowed range is {low} to {high}"
                          + (f", {low} excluded" if setting.low_open else "")) from None
    return value


def setting(section: str, key: str) -> Setting:
    for item in SETTINGS:
        if (item.section, item.key) == (section, key):
            return item
    raise KeyError(f"[{section}] {key}")


def load_config(path: Path | str | None) -> Config:
    """Read a reame.conf; missing keys take their defaults, a missing file means all defaults."""
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
    base_dir = Path.cwd()
    if path is not None:
        path = Path(path).resolve()
        base_dir = path.parent
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        try:
            parser.read(path, encoding="utf-8")
        except configparser.MissingSectionHeaderError as exc:
            raise ConfigError(
                f"{path}: line {exc.lineno}: {exc.line.strip()!r} comes before any [section]"
            ) from None
        except configparser.ParsingError as exc:
            # errors holds (line number, repr of the line)
            lines = "; ".join(f"line {n}: {ast.literal_eval(text).strip()}"
                              for n, text in exc.errors)
            raise ConfigError(f"{path}: cannot parse {lines} (expected key = value)") from None
        except configparser.Error as exc:
            raise ConfigError(f"{path}: {exc.message}") from None
    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    for item in SETTINGS:
        raw = parser.get(item.section, item.key, fallback=None)
        if raw is None:
            raw = str(item.default)
        values[item.section][item.key] = _convert(item, raw, base_dir)
    parts = {name: cls(**values[name]) for name, cls in _SECTIONS.items()}
    return Config(**parts, path=path)


def validate_value(section: str, key: str, value: Any, base_dir: Path) -> Any:
    """The typed value of a setting, or ConfigError naming the key and what is allowed."""
    try:
        item = setting(section, key)
    except KeyError:
        raise ConfigError(f"[{section}] {key}: no such setting") from None
    raw = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if item.kind is int and isinstance(value, float) and value.is_integer():
        raw = str(int(value))
    return _convert(item, raw, base_dir)


def update_config(path: Path, changes: dict[tuple[str, str], Any]) -> Config:
    """Write changed settings into the file, keeping its comments, order and unknown keys.

    Every value is validated first: one bad value writes nothing. The file is replaced
    atomically (temp file, fsync, rename). Returns the config as now written.
    """
    from configupdater import ConfigUpdater  # comment-preserving INI: no hand-written parser

    path = Path(path).resolve()
    for (section, key), value in changes.items():
        validate_value(section, key, value, path.parent)
    updater = ConfigUpdater()
    updater.read(path, encoding="utf-8")
    for (section, key), value in changes.items():
        raw = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if not updater.has_section(section):
            updater.add_section(section)
        if updater.has_option(section, key):
            updater[section][key].value = raw
        else:
            updater[section].set(key, raw)
    text = str(updater)
    write_atomically(path, text, mode=stat.S_IMODE(path.stat().st_mode) if path.exists()
                     else 0o644)
    return load_config(path)
