"""Test servers started from a preloaded interpreter.

`python app.py` spends 4-5 s importing Gradio before it serves; the suite starts dozens of
servers. Here each test worker keeps one forkserver (multiprocessing's) that has imported
app.py's modules once, and every server is a fork of it running the same `app.main(argv)` as
`python app.py` would: a process of its own, its own log, config, port and signals, answering
over HTTP. REAME_TEST_SPAWN=1 starts each server as `python app.py` instead. The command line
itself (the interpreter's start, argument parsing, the imports) has tests of its own
(tests/inference/test_warmup.py, tests/accounts/test_accounts.py, tests/web/gradio_api/test_api.py's malformed config).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path

# What a server imports before it serves (app.py and build_app's web layer).
PRELOAD = ["app", "reame.runtime", "reame.web.server"]  # app.main's imports when it serves
SPAWN = os.environ.get("REAME_TEST_SPAWN") == "1"
# Variables read when they are used, not when a module is imported: a fork may be given other
# values than its forkserver had. Any other difference (HF_ENDPOINT, HF_HOME: huggingface_hub
# reads them at import) starts the server as `python app.py`.
READ_LATE = {"GRADIO_TEMP_DIR", "GRADIO_ANALYTICS_ENABLED", "PYTHONUNBUFFERED"}
_context = None
_preloaded_env: dict[str, str] = {}


def _forkable(env: dict[str, str]) -> bool:
    differs = {key for key in env.keys() | _preloaded_env.keys()
               if env.get(key) != _preloaded_env.get(key)}
    return not {key for key in differs - READ_LATE if not key.startswith("PYTEST_")}


def start(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path):
    """`python app.py *argv` with env in cwd, its output appended to log_path: a Popen, or an
    object that answers what the tests ask of one (pid, poll, wait, terminate, kill)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()  # now, with this environment
        _preloaded_env.update(os.environ)
    if SPAWN or not _forkable(env):
        with log_path.open("ab") as log:
            return subprocess.Popen([sys.executable, str(cwd / "app.py"), *argv], cwd=cwd,
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
    log_path.touch()
    process = _context.Process(target=_run_app, args=(argv, env, str(log_path), str(cwd)),
                               name="reame-server")
    process.start()
    return Forked(process)


def _run_app(argv: list[str], env: dict[str, str], log_path: str, cwd: str) -> None:
    """In the forked process: what `python app.py *argv` does once its imports are done."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import app

    sys.exit(app.main(argv))


class Forked:
    """A forkserver's process with the part of Popen's interface the tests use."""

    def __init__(self, process: multiprocessing.process.BaseProcess):
        self._process = process
        self.pid = process.pid
        self.args = process.name

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
