"""Reame servers of any checkout (this one or a worktree of an older commit), side by side.

`serve(checkout, config)` is a context manager: it starts `python app.py --config CONFIG` of that
checkout on a free loopback port, waits until GET /v1/models answers (401 counts: accounts on),
yields the base URL, and ends the process on exit whatever happened. `commit(checkout)` names it
in the tables. The benchmarks that compare a change with the code before it (login_flood,
disconnect) share these, so that both sides start the same way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commit(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"],
                          capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def serve(checkout: Path, config: Path) -> Iterator[str]:
    """The URL (ending with /) of that checkout's server on that config, while it runs."""
    port = free_port()
    log_path = config.parent / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(checkout / "app.py"), "--config", str(config), "--port",
             str(port)], cwd=checkout, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_ready(process, url, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server ended with {process.returncode}: see {log_path}")
        try:
            urllib.request.urlopen(url + "v1/models", timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # answering (401 without a key)
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server did not answer within {START_TIMEOUT_S} s: see {log_path}")
