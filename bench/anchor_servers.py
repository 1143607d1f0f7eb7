"""The two servers of the anchor benchmark as processes: started, restarted, stopped, and their
memory watched.

- reame: `python app.py` of this checkout (bench/servers.py writes its reame.conf), `[model]
  slots = 4`, n_ctx per slot, the KV cache on disk in its own folder (kept across restarts);
- llama-server: llama.cpp's own server, built by bench/llama_server.py from the sources of the
  pinned llama-cpp-python, with its defaults for slots (auto: 4, one unified KV pool) and
  prompt cache (in RAM, lost at a restart).

Start to ready is taken from the process's start to the first GET /health that answers 200
(both have one: reame answers 503 while loading and warming up, llama-server while loading),
polled every 20 ms. Memory is the RSS of the process and its children, sampled every 100 ms
for the whole life of the process (its peak), and read once after start (idle).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from . import servers

log = logging.getLogger("bench.anchor")

REAME, LLAMA = "reame", "llama-server"
SYSTEMS = (REAME, LLAMA)
READY_TIMEOUT_S = 300
POLL_S = 0.02
SAMPLE_S = 0.1
SETTLE_S = 2.0  # after ready, before the idle reading: start-up work winds down


@dataclass(frozen=True)
class Setup:
    """What both servers run with."""

    model: Path
    binary: Path  # llama-server
    slots: int = 4
    n_ctx: int = 4096  # per slot
    threads: int = os.cpu_count() or 1
    max_tokens: int = 512  # reame's [generation] max_tokens: above any request's


@dataclass
class Server:
    """One system's server over its own folder, across restarts."""

    system: str
    folder: Path
    setup: Setup
    url: str = ""  # ends with /v1
    model_id: str = ""
    ready_s: list[float] = field(default_factory=list)  # one per start
    peak_rss: int = 0  # over every start
    slots_line: str = ""  # what the server's log says about its slots
    _process: subprocess.Popen | None = None
    _sampler: Sampler | None = None

    def start(self) -> float:
        """Start the process and wait for /health 200; the seconds that took."""
        self.folder.mkdir(parents=True, exist_ok=True)
        port = servers.free_port()
        log_path = self.folder / "server.log"
        with log_path.open("ab") as out:
            started = time.perf_counter()
            self._process = subprocess.Popen(
                self._command(port), cwd=servers.ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
        base = f"http://127.0.0.1:{port}"
        ready = wait_healthy(self._process, base + "/health", started, log_path)
        self.ready_s.append(ready)
        self.url = base + "/v1"
        with urllib.request.urlopen(self.url + "/models", timeout=10) as answer:
            self.model_id = json.loads(answer.read())["data"][0]["id"]
        self._sampler = Sampler(self._process.pid)
        self.slots_line = slots_line(self.system, log_path) or self.slots_line
        log.info("%s: ready in %.2f s on port %d (%s)", self.system, ready, port,
                 self.slots_line or "slots: not in its log")
        return ready

    def stop(self) -> None:
        if self._sampler:
            self.peak_rss = max(self.peak_rss, self._sampler.stop())
            self._sampler = None
        if self._process:
            servers.stop(self._process)  # reame finishes its queued KV writes first
            self._process = None

    def restart(self) -> float:
        self.stop()
        return self.start()

    def rss_now(self) -> int:
        return rss_tree(self._process.pid) if self._process else 0

    def _command(self, port: int) -> list[str]:
        s = self.setup
        if self.system == REAME:
            config = servers._reame_config(self.folder, s.model, n_ctx=s.n_ctx,
                                           threads=s.threads, max_tokens=s.max_tokens,
                                           slots=s.slots)
            return [sys.executable, str(servers.ROOT / "app.py"), "--config", str(config),
                    "--port", str(port)]
        # -np is left out: its default (auto) is 4 slots over one unified KV pool, and an
        # explicit -np would switch the pool off. -c sizes the pool, --kv-unified-per-slot
        # caps each slot at n_ctx as reame's are. Everything else is its default: the prompt
        # cache in RAM (--cache-ram 8192 MiB), idle slots saved to it, no --cache-reuse.
        return [str(s.binary), "-m", str(s.model), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(s.n_ctx * s.slots), "--kv-unified-per-slot", str(s.n_ctx),
                "--threads", str(s.threads)]


def wait_healthy(process: subprocess.Popen, url: str, started: float, log_path: Path) -> float:
    """Seconds from started until url answers 200; RuntimeError if the process ends first."""
    while time.perf_counter() < started + READY_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} ended with code {process.returncode}: "
                               f"{servers._tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return time.perf_counter() - started
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"{url} did not answer 200 within {READY_TIMEOUT_S} s")


def slots_line(system: str, log_path: Path) -> str:
    """The log's last word on the slots: reame's "loaded X (n_ctx N, K slots, ...)",
    llama-server's "n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'"."""
    pattern = (r"n_ctx \d+, \d+ slots?" if system == REAME
               else r"n_slots = \d+, n_ctx_slot = \d+, kv_unified = '\w+'")
    found = re.findall(pattern, log_path.read_text(errors="replace"))
    return found[-1] if found else ""


def rss_tree(pid: int) -> int:
    """Resident bytes of the process and its children (reame's forkserver helpers)."""
    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


class Sampler:
    """The highest rss_tree of a process, sampled in a thread until stop()."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_tree(self.pid))
            if self._stop.wait(SAMPLE_S):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
