"""`python app.py adduser|passwd|deluser|addkey|revokekey|users|adopt ...`: manage accounts.

What each command does is in manage.py (the page's Users tab does the same). The users file
is the one reame.conf names in [server] users_file; adduser sets it to
users.json (beside reame.conf) when it is empty. Passwords are read from the terminal without
echo, or from standard input with --password-stdin (one line), for scripts.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from reame.accounts import manage
from reame.accounts.users import AccountError, Accounts
from reame.config.reame_conf import ConfigError, load_config

COMMANDS = ("adduser", "passwd", "deluser", "addkey", "revokekey", "users", "adopt")


def run_command(argv: list[str], default_config: Path) -> int:
    parser = argparse.ArgumentParser(prog="python app.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=default_config)
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("adduser", help="create a user (and print an API key with --key)")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may change the settings")
    add.add_argument("--key", action="store_true", help="also make an API key and print it")
    add.add_argument("--password-stdin", action="store_true")
    passwd = sub.add_parser("passwd", help="set a user's password")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true")
    sub.add_parser("deluser", help="remove a user and end their sessions (their chats stay, "
                                   "unreachable until `adopt NAME --from ID`)"
                   ).add_argument("name")
    sub.add_parser("addkey", help="make an API key for a user and print it").add_argument("name")
    revoke = sub.add_parser("revokekey", help="revoke one of a user's API keys")
    revoke.add_argument("name")
    revoke.add_argument("key_id")
    sub.add_parser("users", help="list users and their key ids")
    adopt = sub.add_parser("adopt", help="give a user the chats made before accounts were on "
                                         "(they belong to nobody and nobody sees them)")
    adopt.add_argument("name")
    adopt.add_argument("--from", dest="from_user", metavar="USER",
                       help="instead, the chats of USER: a name, or the id deluser printed")
    # Accept `app.py adduser NAME --config X` as well as `app.py --config X adduser NAME`.
    args = parser.parse_args(_config_first(argv))
    try:
        accounts = _accounts(args.config, create=args.command == "adduser")
        given = accounts.assign_ids()
        if given:
            give_ids(given, _store(args.config))
        if args.command == "adopt":
            return _adopt(args, accounts)
        return _run(args, accounts)
    except (AccountError, ConfigError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2


def _store(config_path: Path):
    """The chat database reame.conf names; ConfigError says why it cannot be used. (Imported
    here: the commands that never touch chats skip SQLAlchemy's import.)"""
    from reame.chats.store import DatabaseUnavailable, Store

    try:
        return Store(load_config(config_path).storage.database)
    except DatabaseUnavailable as exc:
        raise ConfigError(str(exc)) from None


def give_ids(given: dict[str, str], store) -> None:
    """The chats of users from before ids (owned by the name) move to their new ids
    (Accounts.assign_ids gives them)."""
    for name, user_id in given.items():
        moved = store.give_chats(name, user_id)
        print(f"user {name} is now {user_id}; {moved} chat{'' if moved == 1 else 's'} moved "
              f"with them", file=sys.stderr)


def _config_first(argv: list[str]) -> list[str]:
    if "--config" in argv[1:]:
        i = argv.index("--config")
        return argv[i:i + 2] + argv[:i] + argv[i + 2:]
    return argv


def _accounts(config_path: Path, *, create: bool) -> Accounts:
    accounts, written = manage.open_accounts(config_path, create=create)
    if written:
        print(written)
    return accounts


def _adopt(args: argparse.Namespace, accounts: Accounts) -> int:
    manage.known(accounts, args.name)  # before the database is opened
    print(manage.adopt(accounts, _store(args.config), args.name, args.from_user))
    return 0


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        raise AccountError("the passwords differ")
    return first


def _run(args: argparse.Namespace, accounts: Accounts) -> int:
    if args.command == "adduser":
        said = manage.add_user(accounts, args.name, _password(args.password_stdin),
                               admin=args.admin)
        print(f"{said}, in {accounts.path}")
        if args.key:
            print(f"API key (shown once): {manage.add_key(accounts, args.name)}")
    elif args.command == "passwd":
        print(manage.set_password(accounts, args.name, _password(args.password_stdin)))
    elif args.command == "deluser":
        print(manage.remove_user(accounts, args.name))
    elif args.command == "addkey":
        print(f"API key for {args.name} (shown once): {manage.add_key(accounts, args.name)}")
    elif args.command == "revokekey":
        print(manage.revoke_key(accounts, args.name, args.key_id))
    elif args.command == "users":
        for row in manage.users(accounts):
            print(manage.users_line(row))
    return 0
