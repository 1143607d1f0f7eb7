"""Chat servers as real processes on a free port, for the benchmarks that measure over HTTP.

`start(kind, ...)` is a context manager: it writes the server's config into its own folder,
starts the process, waits until GET /v1/models names a model, and ends the process on exit
(terminate, then kill), whatever happened in between.

- reame: `python app.py` of this checkout, no accounts, `[model] slots = N`;
- reame serial: the same with `slots = 1`, one turn at a time (Reame before slots);
- llama-cpp-python server: `python -m llama_cpp.server`, when `llama-cpp-python[server]` is
  installed (`llama_server_missing()` says why not otherwise).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
REAME_SLOTS, REAME_SERIAL, LLAMA_SERVER = "reame", "reame serial", "llama-cpp-python server"
# --user-systems keys -> the names in the results
KINDS = {"reame": REAME_SLOTS, "serial": REAME_SERIAL, "llama-server": LLAMA_SERVER}
START_TIMEOUT_S = 180


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it and the model id it answers to."""

    kind: str
    url: str  # ends with /v1
    model_id: str
    log_path: Path
    pid: int = 0  # the server process (bench/memory.py reads its memory)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def llama_server_missing() -> str | None:
    """Why llama-cpp-python's server cannot run here, or None."""
    try:
        import llama_cpp.server.app  # noqa: F401  (its extra deps: sse-starlette, ...)
    except ImportError as exc:
        return f"not installed ({exc.name} missing: pip install 'llama-cpp-python[server]')"
    return None


def reame_knows_slots() -> bool:
    """Whether this checkout reads `[model] slots` (unknown keys are ignored silently)."""
    from reame.config.reame_conf import SETTINGS

    return any((s.section, s.key) == ("model", "slots") for s in SETTINGS)


@contextlib.contextmanager
def start(kind: str, folder: Path, model: Path, *, n_ctx: int, slots: int, threads: int = 0,
          max_tokens: int = 200, kv_type: str = "f16",
          kv_ram_mb: int = 1000000, mmap: str | None = None) -> Iterator[Server]:
    """The server of that kind over folder, ended on exit. threads 0: all cores. kv_type,
    kv_ram_mb and mmap: reame's [cache] kv_type, [model] kv_ram_mb (the default lets every slot
    in) and [model] mmap (None: not written, the checkout's default)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if kind == LLAMA_SERVER:
        command = _llama_server_command(model, n_ctx, threads, port)
    else:
        config = _reame_config(folder, model, n_ctx=n_ctx, threads=threads, max_tokens=max_tokens,
                               slots=1 if kind == REAME_SERIAL else slots, kv_type=kv_type,
                               kv_ram_mb=kv_ram_mb, mmap=mmap)
        command = [sys.executable, str(ROOT / "app.py"), "--config", str(config),
                   "--port", str(port)]
    log_path = folder / "server.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        url = f"http://127.0.0.1:{port}/v1"
        model_id = _wait_ready(process, url, log_path)
        log.info("%s: listening on port %d (model %s)", kind, port, model_id)
        yield Server(kind, url, model_id, log_path, process.pid)
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()  # reame finishes its queued KV writes first
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _reame_config(folder: Path, model: Path, *, n_ctx: int, threads: int, max_tokens: int,
                  slots: int, kv_type: str = "f16", kv_ram_mb: int = 1000000,
                  mmap: str | None = None) -> Path:
    sessions = folder / "sessions"
    config = folder / "reame.conf"
    # By default kv_ram_mb and max_waiting high enough that every slot is used and no client
    # is refused (a checkout without slots ignores the three keys).
    config.write_text(
        f"[model]\nmodel_path = {model.resolve()}\nn_ctx = {n_ctx}\nn_threads = {threads}\n"
        f"slots = {slots}\nkv_ram_mb = {kv_ram_mb}\n" + (f"mmap = {mmap}\n" if mmap else "")
        + "\n"
        f"[generation]\ntemperature = 0\ntop_p = 1\nmax_tokens = {max_tokens}\n\n"
        f"[server]\nusers_file =\nmax_waiting = 1000\n\n"
        f"[storage]\nsessions_dir = {sessions}\n\n"
        f"[cache]\nenabled = true\ndir = {sessions / 'kv'}\nmax_disk_mb = 1000000\n"
        f"kv_type = {kv_type}\n")
    return config


def _llama_server_command(model: Path, n_ctx: int, threads: int, port: int) -> list[str]:
    threads = threads or os.cpu_count() or 1  # its own default is half the cores
    # interrupt_requests off: by default a new request ends the reply being streamed.
    # logits_all off: chat needs only the last token's logits (its default computes all).
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
            "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads",
            str(threads), "--n_threads_batch", str(threads), "--interrupt_requests", "False",
            "--logits_all", "False"]


def _wait_ready(process: subprocess.Popen, url: str, log_path: Path) -> str:
    """The model id, once GET /v1/models lists one; RuntimeError if the process ends or is
    too slow."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server ended with code {process.returncode}: "
                               f"{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as answer:
                models = json.loads(answer.read())["data"]
            if models:
                return models[0]["id"]
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server did not answer within {START_TIMEOUT_S} s: {_tail(log_path)}")


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
