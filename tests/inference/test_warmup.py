"""The warm-up at start: it runs the model on a slot, leaves nothing behind (no KV, no file,
no counted turn, the same replies), and GET /health says ok only once it is done. (How much
faster the first request is: bench/warmup.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from reame.inference.engine import Engine
from reame.inference.warmup import warm_model
from reame.runtime import service_over
from tests.conftest import GREEDY, ROOT, THREADS, free_port, write_config

QUESTION = "Name three colours of the rainbow."


def reply_of(service) -> tuple[str, str]:
    chat = service.new_chat()
    *_, done = service.send(chat.id, QUESTION)
    return done.text, done.stats.source


@pytest.mark.slow
def test_the_warm_up_runs_the_model_and_leaves_nothing_behind(tmp_path, model_path):
    engine = Engine(model_path, n_ctx=1024, slots=2, n_threads=THREADS)
    try:
        cold = service_over(tmp_path / "cold", engine, GREEDY)
        expected = reply_of(cold)
        for seq in engine.sequences:
            engine.use(seq)
            engine.clear()

        service = service_over(tmp_path / "warm", engine, GREEDY)
        before = engine.evaluated
        # What the app runs at start (runtime.build_service_soon).
        assert warm_model(service) > 0
        assert engine.evaluated > before, "the model ran"
        assert all(not seq.tokens for seq in engine.sequences), "the slots are empty again"
        assert service.cache.stats()["lookups"] == 0
        assert list((tmp_path / "warm" / "kv").glob("*.kv")) == []
        assert reply_of(service) == expected, "the same reply, from nothing reused"
    finally:
        engine.close()


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "health", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        assert json.loads(refused.read())["status"] in ("warming_up", "loading"), refused
        return refused.code
    except OSError:
        return None  # not listening yet


@pytest.mark.slow
def test_health_says_ok_only_once_the_warm_up_is_done(tmp_path, model_path):
    config = write_config(tmp_path, model_path=model_path, warm_up=True)
    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--config", str(config), "--port", str(port)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while health(url) != 200:
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.01)
        # The flag that keeps /health at 503 is cleared after this line is logged.
        assert "warmed up in" in log_path.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_model_loads_and_warms_on_one_thread_then_decodes_on_all(tmp_path, model_path):
    """While the app imports and builds its page, the engine decodes on one thread (the other
    core is the import's); once warm, on every thread it was configured with."""
    import llama_cpp

    from reame.config.reame_conf import load_config
    from reame.runtime import build_service_soon

    # The engine in this process: its llama.cpp context is read here.
    config = load_config(write_config(tmp_path, model_path=model_path, warm_up=True,
                                      engine_process=False))
    service = build_service_soon(config, warm_up=True).result(timeout=60)
    try:
        engine = service.runtime.engine
        deadline, seen = time.monotonic() + 60, []
        while service.warming:  # (it warms for a tenth of a second at least)
            seen.append(llama_cpp.llama_n_threads(engine.context))
            assert time.monotonic() < deadline, "never warm"
            time.sleep(0.005)
        assert seen[0] == 1 and set(seen) <= {1, engine.n_threads}, seen
        assert llama_cpp.llama_n_threads(engine.context) == engine.n_threads == (
            THREADS or os.cpu_count())
        assert engine.evaluated > 0, "the model ran"
    finally:
        service.close()
