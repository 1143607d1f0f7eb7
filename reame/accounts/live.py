"""The running server's accounts: off (None) or on, and turned on while it runs when the page
of a server without accounts makes the first admin (manage.first_admin). Never turned off
while it runs. Who asks at each request (the login, /v1's keys, /metrics, the page) reads
`current`, so that the switch takes effect at once, everywhere."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from reame.accounts import manage
from reame.accounts.users import AccountError, Accounts

log = logging.getLogger(__name__)


class LiveAccounts:
    def __init__(self, accounts: Accounts | None, config_path: Path | None):
        self.current = accounts
        self.config_path = config_path
        self._lock = threading.Lock()
        self._turned_on: list[Callable[[Accounts, str | None], None]] = []

    def when_turned_on(self, callback: Callable[[Accounts, str | None], None]) -> None:
        """Call callback(accounts, page) once accounts are turned on here (e.g. Gradio's
        login); page: the Gradio session of the page that turned them on, if any."""
        self._turned_on.append(callback)

    def turn_on(self, name: str, password: str, *, page: str | None = None) -> str:
        """Accounts on, with name as their first admin; what was done (AccountError: why
        not). Once: from then on users are managed by an admin. page: the Gradio session of
        the page doing it (its answer is still to reach it)."""
        with self._lock:
            if self.current is not None:
                raise AccountError("accounts are on already: log in, and an admin adds users")
            if self.config_path is None:
                raise AccountError("this server runs without a reame.conf to write the users "
                                   "file's name into")
            accounts, said = manage.first_admin(self.config_path, name, password)
            for callback in self._turned_on:
                callback(accounts, page)
            self.current = accounts
        log.warning("accounts turned on from the page: %s is the first admin", name)
        return said

    def can_configure(self, user: str | None) -> bool:
        """Whether user (a logged-in user's id) may change the settings and manage users:
        anyone without accounts (there is one user), an admin with them."""
        accounts = self.current
        return accounts is None or accounts.is_admin(accounts.name_of(user))

    def name_of(self, user: str | None) -> str | None:
        accounts = self.current
        return accounts.name_of(user) if accounts is not None else None
