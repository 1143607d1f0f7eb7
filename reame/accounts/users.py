"""Users, their passwords and their API keys: one JSON file, written atomically, mode 0600.

Passwords are stored as scrypt hashes (hashlib.scrypt, a random salt each); API keys as
SHA-256 hashes (a key is 32 random bytes, so a fast hash is enough: there is nothing to guess).
The file:

    {"users": {"alice": {"id": "u:9c41d2e07b5a", "password": "scrypt$16384$8$1$<salt>$<hash>",
                         "admin": true, "epoch": 0,
                         "keys": [{"id": "3f2a9c1e", "sha256": "<hex>", "created": 1764480000.0}]}}}

A user's id ("u:" and 12 random hex digits; no name has a colon) is never reused: chats and
cached KV belong to it, not to the name, so a new user given a deleted user's name starts
with nothing. epoch counts the changes that end
the user's web sessions (a new password, a revoked key); deleting the user ends them too.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from pathlib import Path

from reame.config.files import write_atomically

KEY_PREFIX = "rk-"
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}  # about 50 ms per check on one core here
MIN_PASSWORD = 8


class AccountError(ValueError):
    """A bad user name, password or key operation; the message says which."""


def hash_password(password: str) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return "scrypt${n}${r}${p}${salt}${digest}".format(
        **_SCRYPT, salt=base64.b64encode(salt).decode(), digest=base64.b64encode(digest).decode())


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        actual = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), dklen=32,
                                n=int(n), r=int(r), p=int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, base64.b64decode(digest))


# Checked for unknown names, at the same cost as a known name's hash: a random salt and digest
# (no password has it), so that making it costs no scrypt at start (50 ms, on the way to ready).
_UNKNOWN_NAME = "scrypt${n}${r}${p}${salt}${digest}".format(
    **_SCRYPT, salt=base64.b64encode(os.urandom(16)).decode(),
    digest=base64.b64encode(os.urandom(32)).decode())


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Accounts:
    """The users file. Reads are from memory; every change is saved at once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._users: dict[str, dict] = {}
        self._mtime = None
        self.reload()

    def reload(self) -> None:
        """Read the file again (the CLI may have changed it while the server runs)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise AccountError(f"cannot read the users file {self.path}: {exc}") from None
        users = data.get("users", {})
        if not isinstance(users, dict):
            raise AccountError(f"the users file {self.path} has no 'users' object")
        self._users = users
        self._version = getattr(self, "_version", 0) + 1

    def _fresh(self) -> None:
        try:
            if self.path.stat().st_mtime != self._mtime:
                self.reload()
        except FileNotFoundError:
            self._users = {}

    # queries

    def names(self) -> list[str]:
        self._fresh()
        return sorted(self._users)

    def __bool__(self) -> bool:
        return bool(self.names())

    def is_admin(self, name: str | None) -> bool:
        self._fresh()
        return bool(name and self._users.get(name, {}).get("admin"))

    def check_password(self, name: str, password: str) -> bool:
        self._fresh()
        user = self._users.get(name)
        if user is None:
            verify_password(password, _UNKNOWN_NAME)  # one scrypt, as for a known name
            return False
        return verify_password(password, user.get("password", ""))

    def user_id(self, name: str | None) -> str | None:
        """The stable id of a user (None: no such user, or one from before ids: see
        assign_ids)."""
        self._fresh()
        user = self._users.get(name) if name else None
        return user.get("id") if user is not None else None

    def name_of(self, user_id: str | None) -> str | None:
        self._fresh()
        return next((name for name, user in self._users.items()
                     if user_id and user.get("id") == user_id), None)

    @property
    def version(self) -> int:
        """Grows with every change of the file (this process's or another's)."""
        self._fresh()
        return self._version

    def session_stamp(self, name: str) -> tuple | None:
        """What a web login depends on: a login made when it was different is over."""
        self._fresh()
        user = self._users.get(name)
        if user is None:
            return None
        return user.get("id"), user.get("password"), user.get("epoch", 0)

    def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None."""
        if not key.startswith(KEY_PREFIX):
            return None
        self._fresh()
        wanted = _key_hash(key)
        found = None
        for name, user in self._users.items():
            for entry in user.get("keys", []):
                if hmac.compare_digest(entry.get("sha256", ""), wanted):
                    found = name
        return found

    def keys(self, name: str) -> list[dict]:
        self._fresh()
        return [{"id": k["id"], "created": k.get("created")}
                for k in self._user(name).get("keys", [])]

    # changes

    def add_user(self, name: str, password: str, *, admin: bool = False) -> None:
        check_new_user(name, password)
        with self._changing():
            self.reload()
            if name in self._users:
                raise AccountError(f"user {name!r} exists already")
            self._users[name] = {"id": self._new_id(), "password": hash_password(password),
                                 "admin": admin, "epoch": 0, "keys": []}
            self._save()

    def set_password(self, name: str, password: str) -> None:
        _check_password(password)
        with self._changing():
            self.reload()
            user = self._user(name)
            user["password"] = hash_password(password)
            user["epoch"] = user.get("epoch", 0) + 1
            self._save()

    def remove_user(self, name: str) -> None:
        """Remove a user (their chats stay, owned by their id); never the last admin: then
        nobody could manage the others, nor the settings, from the page."""
        with self._changing():
            self.reload()
            if self._user(name).get("admin") and not any(
                    user.get("admin") for other, user in self._users.items() if other != name):
                raise AccountError(f"{name!r} is the last admin and cannot be removed "
                                   f"(add another admin first)")
            del self._users[name]
            self._save()

    def add_key(self, name: str) -> str:
        """A new API key for the user; shown once, only its hash is kept."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._changing():
            self.reload()
            self._user(name).setdefault("keys", []).append(
                {"id": secrets.token_hex(4), "sha256": _key_hash(key), "created": time.time()})
            self._save()
        return key

    def revoke_key(self, name: str, key_id: str) -> None:
        with self._changing():
            self.reload()
            user = self._user(name)
            kept = [k for k in user.get("keys", []) if k["id"] != key_id]
            if len(kept) == len(user.get("keys", [])):
                raise AccountError(f"user {name!r} has no key {key_id!r}")
            user["keys"] = kept
            user["epoch"] = user.get("epoch", 0) + 1
            self._save()

    def assign_ids(self) -> dict[str, str]:
        """Give an id to every user from before ids (their chats were owned by the name);
        the ids given, by name, for the caller to move those chats to."""
        with self._changing():
            self.reload()
            given = {name: self._new_id() for name, user in self._users.items()
                     if not user.get("id")}
            if given:
                for name, user_id in given.items():
                    self._users[name]["id"] = user_id
                self._save()
        return given

    def _new_id(self) -> str:
        taken = {user.get("id") for user in self._users.values()}
        while (user_id := f"u:{secrets.token_hex(6)}") in taken:
            pass
        return user_id

    @contextlib.contextmanager
    def _changing(self):
        """Hold the file for a read-modify-write: this process's threads and other processes
        (two CLI runs at once, or the CLI and the server) wait for each other, so that no
        change is lost."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _user(self, name: str) -> dict:
        try:
            return self._users[name]
        except KeyError:
            raise AccountError(f"no user {name!r}") from None

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps({"users": self._users}, indent=1,
                                               sort_keys=True), mode=0o600)
        self._mtime = self.path.stat().st_mtime
        self._version += 1


def check_new_user(name: str, password: str) -> None:
    """AccountError unless name and password may be a new user's."""
    if not _NAME.match(name):
        raise AccountError("a user name is 1-64 letters, digits or _ . @ -")
    _check_password(password)


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise AccountError(f"a password has at least {MIN_PASSWORD} characters")
