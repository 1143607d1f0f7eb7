"""GET /health on real servers: 200 while serving, 503 and why (in one word) while a model
loads or when none is loaded; no login needed, and nothing more said."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.accounts.test_accounts import guarded  # noqa: F401 - a fixture: a server with accounts
from tests.conftest import start_server
from tests.gradio_api import ApiClient


def health(server) -> tuple[int, dict, object]:
    """The status, body and headers (any case) of GET /health, without any login."""
    try:
        with urllib.request.urlopen(server.url + "health", timeout=30) as answer:
            return answer.status, json.loads(answer.read()), answer.headers
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read()), refused.headers


def test_health_says_ok_without_a_login_and_nothing_more(guarded):  # noqa: F811
    server, _ = guarded
    status, body, _ = health(server)
    assert (status, body) == (200, {"status": "ok"})


def test_health_says_no_model_without_naming_the_file(tmp_path):
    (tmp_path / "models").mkdir()
    server = start_server(tmp_path, model_path="models/secret-name.gguf")
    try:
        status, body, _ = health(server)
        assert (status, body) == (503, {"status": "no_model"})
    finally:
        server.stop()


@pytest.mark.slow
def test_health_says_loading_while_a_model_switch_loads(tmp_path, model_path, gemma_path):
    server = start_server(tmp_path, model_path=model_path, max_tokens=400)
    try:
        assert health(server)[:2] == (200, {"status": "ok"})
        gradio = ApiClient(server.url, verbose=False)
        # A long reply holds the model, so the switch waits, loading all the while.
        chat = gradio.predict(api_name="/new_chat")
        story = gradio.submit(chat, "Write a long story about a lighthouse keeper.",
                              api_name="/send")
        deadline = time.monotonic() + 60
        while not story.outputs():
            assert time.monotonic() < deadline, "no story"
            time.sleep(0.02)
        switch = gradio.submit({"model": {"model_path": str(gemma_path)}},
                               api_name="/update_settings")
        seen = []
        while not switch.done():
            seen.append(health(server))
            assert time.monotonic() < deadline + 120
            time.sleep(0.05)
        loading = [(status, body, headers) for status, body, headers in seen if status != 200]
        assert loading, "the load was never seen"
        assert all(status == 503 and body == {"status": "loading"}
                   and headers["Retry-After"] == "2" for status, body, headers in loading)
        story.result(timeout=120)
        assert health(server)[:2] == (200, {"status": "ok"})
    finally:
        server.stop()
