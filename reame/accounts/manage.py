"""Managing accounts: what `python app.py adduser|passwd|deluser|addkey|revokekey|users|adopt`
(cli.py) and the admin's Users tab of the page (reame/web/page/users_panel.py) both do, with the
same rules and the same words. Each change returns the sentence that says what was done; a
refusal is an AccountError saying why. store: the chat database (reame.chats.store.Store), for
the chats that follow users.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reame.accounts.users import AccountError, Accounts, check_new_user
from reame.config.reame_conf import load_config, update_config

DEFAULT_USERS_FILE = "users.json"


def open_accounts(config_path: Path, *, create: bool) -> tuple[Accounts, str | None]:
    """The accounts file reame.conf names, and what was written to get it: with create, when
    reame.conf names none, `users_file = users.json` (beside it) is written first."""
    config = load_config(config_path)
    if config.users_path is not None:
        return Accounts(config.users_path), None
    if not create:
        raise AccountError(f"{config_path} has no [server] users_file: no accounts yet "
                           f"(adduser makes the first)")
    config = update_config(config_path, {("server", "users_file"): DEFAULT_USERS_FILE})
    return (Accounts(config.users_path),
            f"[server] users_file = {DEFAULT_USERS_FILE} written to {config_path}")


def first_admin(config_path: Path, name: str, password: str) -> tuple[Accounts, str]:
    """Turn accounts on with their first user, an admin (the page of a server without
    accounts does it): reame.conf gets a users_file if it has none. Refused, with nothing
    written, for a bad name or password, or when the users file has users already (made by
    `python app.py adduser` while this server ran: a restart turns them on)."""
    check_new_user(name, password)
    config = load_config(config_path)
    if config.users_path is not None and Accounts(config.users_path).names():
        raise AccountError(f"{config.users_path} has users already (made with `python app.py "
                           f"adduser`): restart Reame to turn accounts on")
    accounts, _ = open_accounts(config_path, create=True)
    said = add_user(accounts, name, password, admin=True)
    return accounts, f"accounts are on; {said}"


@dataclass(frozen=True)
class UserRow:
    """A user as the lists show them (never a password or a key, only key ids)."""

    name: str
    admin: bool
    chats: int
    keys: tuple[str, ...]


def _chats(n: int) -> str:
    return f"{n} chat{'' if n == 1 else 's'}"


def users(accounts: Accounts, store=None) -> list[UserRow]:
    """Every user, by name; with the store, how many chats each has."""
    counts = store.owners() if store is not None else {}
    return [UserRow(name, accounts.is_admin(name), counts.get(accounts.user_id(name), 0),
                    tuple(k["id"] for k in accounts.keys(name)))
            for name in accounts.names()]


def users_line(row: UserRow) -> str:
    """`app.py users`: one line a user."""
    return f"{row.name}{' (admin)' if row.admin else ''}: {', '.join(row.keys) or 'no keys'}"


def add_user(accounts: Accounts, name: str, password: str, *, admin: bool = False) -> str:
    """A new user; the first one is an admin whatever admin says."""
    first = not accounts.names()
    accounts.add_user(name, password, admin=admin or first)
    return (f"user {name} added"
            + (" (admin: the first user)" if first and not admin else " (admin)" if admin else ""))


def set_password(accounts: Accounts, name: str, password: str) -> str:
    """A new password; the user's open sessions end (login.py)."""
    accounts.set_password(name, password)
    return f"password of {name} changed"


def remove_user(accounts: Accounts, name: str) -> str:
    """Remove a user and end their sessions. Their chats stay, owned by their id (a new user
    given the name starts empty), until adopt gives them to someone."""
    user_id = accounts.user_id(name)
    accounts.remove_user(name)
    return (f"user {name} removed; their chats stay, owned by {user_id}: "
            f"`python app.py adopt NAME --from {user_id}` gives them to another user")


def add_key(accounts: Accounts, name: str) -> str:
    """A new API key for /v1: returned once, only its hash is kept."""
    return accounts.add_key(name)


def revoke_key(accounts: Accounts, name: str, key_id: str) -> str:
    accounts.revoke_key(name, key_id)
    return f"key {key_id} of {name} revoked"


def adopt(accounts: Accounts, store, name: str, from_user: str | None = None) -> str:
    """Give name the chats made without accounts, or (from_user) those of another user: a
    name, or the id of a removed user (remove_user says it)."""
    known(accounts, name)
    source = from_user
    if source is not None:  # a user's name, else an id (of a removed user) or an old name
        source = accounts.user_id(source) or source
    moved = store.give_chats(source, accounts.user_id(name))
    whose = f"of {from_user}" if from_user else "made without accounts"
    return (f"{_chats(moved)} {whose} now belong{'s' if moved == 1 else ''} to {name}")


def known(accounts: Accounts, name: str) -> None:
    """AccountError unless name is a user's."""
    if name not in accounts.names():
        raise AccountError(f"no user {name!r} (add one with `python app.py adduser NAME`)")


def ownerless(store) -> int:
    """How many chats were made without accounts (nobody sees them once accounts are on)."""
    return store.count_chats(None)


def left_behind(accounts: Accounts, store) -> dict[str, int]:
    """The chats of users that were removed, by their old id: nobody sees them."""
    ids = {accounts.user_id(name) for name in accounts.names()}
    return {owner: n for owner, n in store.owners().items()
            if owner is not None and owner not in ids}
