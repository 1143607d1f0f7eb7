"""nginx from Debian's package, started by a test in the foreground on a free port, with its
pid, logs and temp files in a folder of the test's: the http block's body is the test's."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import free_port

NGINX = Path("/usr/sbin/nginx")


class Nginx:
    """nginx serving http_body(port) (server blocks, log formats...) on 127.0.0.1:port, once
    GET health_url (relative to 127.0.0.1:port) answers 200 through it."""

    def __init__(self, folder: Path, http_body: Callable[[int], str], health_path: str,
                 timeout: float = 90):
        if not NGINX.exists():
            pytest.fail(f"nginx is missing at {NGINX}: run `make tools` (Debian's nginx-light)")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.port = folder, free_port()
        temp = "\n".join(f"    {kind}_temp_path {folder / kind};"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (folder / "nginx.conf").write_text(
            f"worker_processes 1;\npid {folder / 'nginx.pid'};\n"
            f"error_log {folder / 'error.log'} warn;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{\n{temp}\n{http_body(self.port)}\n}}\n")
        self.process = subprocess.Popen(
            [str(NGINX), "-c", str(folder / "nginx.conf"), "-p", str(folder), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=(folder / "stderr.log").open("wb"))
        self._wait(f"http://127.0.0.1:{self.port}/{health_path.lstrip('/')}", timeout)

    def _wait(self, url: str, timeout: float) -> None:
        """Until url says ok through nginx (a node warming its model up says 503)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx ended: {(self.folder / 'stderr.log').read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nginx did not pass {url} on")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
