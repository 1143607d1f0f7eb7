"""A real PostgreSQL server for the tests: initdb into a temp folder, postgres on a free port of
127.0.0.1 (password login) and on a socket in that folder, stopped at the end of the session.

Import the fixtures where they are used:

    from .postgres import postgres, postgres_url  # noqa: F401 - fixtures

`postgres` is the server (one per session); `postgres_url` is a new, empty database on it for
each test. Missing binaries fail the tests, never skip them: install Debian's `postgresql`
(`make tools`).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from itertools import count
from pathlib import Path

import psycopg
import pytest

from .conftest import free_port


def _bin_dir() -> Path:
    """Where initdb, postgres and pg_ctl are: $REAME_PG_BIN, else Debian's newest
    /usr/lib/postgresql/<version>/bin, else beside an initdb on PATH."""
    if os.environ.get("REAME_PG_BIN"):
        return Path(os.environ["REAME_PG_BIN"])
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                    key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if debian:
        return debian[-1].parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else Path("/usr/lib/postgresql/15/bin")


BIN = _bin_dir()
SUPERUSER = "reame"
_databases = count(1)


class Postgres:
    """One postgres process over a data folder made for it; as root, it runs as the user
    `postgres` (or `nobody`): initdb refuses root."""

    def __init__(self):
        missing = [name for name in ("initdb", "postgres", "pg_ctl") if not (BIN / name).exists()]
        if missing:
            pytest.fail(f"PostgreSQL is missing ({', '.join(missing)} not in {BIN}): install "
                        f"Debian's postgresql (`make tools`, or `apt-get install postgresql`)")
        # Not under pytest's tmp folder: that one is root's alone (0700), and the server's
        # user must reach its data folder.
        self.folder = Path(tempfile.mkdtemp(prefix="reame-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.user = _server_user()
        self._prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def start(self) -> Postgres:
        """initdb (the superuser's password from a file, never on a command line), then
        postgres until pg_ctl sees it accept connections."""
        secret = self.folder / "password"
        secret.write_text(self.password + "\n")
        if self.user:
            shutil.chown(secret, self.user)
        self._run(BIN / "initdb", "-D", self.data, "-U", SUPERUSER, "--pwfile", secret,
                  "--auth", "scram-sha-256", "--encoding", "UTF8", "--locale", "C.UTF-8")
        secret.unlink()
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.folder} -c fsync=off "
                   f"-c max_connections=200")
        self._run(BIN / "pg_ctl", "-D", self.data, "-l", self.folder / "server.log", "-o",
                  options, "-w", "-t", "60", "start")
        return self

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        name = f"test_{next(_databases)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.data.exists():
            self._run(BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def _run(self, *command, check: bool = True) -> None:
        done = subprocess.run([*self._prefix, *map(str, command)], cwd=self.folder,
                              capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} failed: {done.stdout}{done.stderr}"
                               f"{self.log()}")


def _server_user() -> str | None:
    """Whom to run PostgreSQL as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    pytest.fail("running as root, and neither a `postgres` nor a `nobody` user exists to run "
                "PostgreSQL as (initdb refuses root)")


@pytest.fixture(scope="session")
def postgres() -> Postgres:
    server = Postgres()
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres) -> str:
    """A new, empty database of the session's server (postgresql://... with its password)."""
    return postgres.create_database()

