"""Reame under a path behind a real nginx (Debian's), configured with deploy/nginx-reame.conf
itself: the page in Chromium, a streamed /send through gradio_client, a streamed /v1 reply
through the openai SDK, all at http://127.0.0.1:PORT/reame/."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from openai import OpenAI
from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser and page are fixtures
    BOT,
    browser,
    current_id,
    open_app,
    page,
    send,
)
from tests.conftest import ROOT, start_server
from tests.gradio_api import ApiClient
from tests.nginx import Nginx

LOCATION = ROOT / "deploy" / "nginx-reame.conf"
PREFIX = "/reame"


class ProxyUnderPath(Nginx):
    """nginx with the documented location blocks pointed at upstream's port."""

    def __init__(self, folder: Path, upstream_port: int):
        locations = LOCATION.read_text().replace("127.0.0.1:7860", f"127.0.0.1:{upstream_port}")
        super().__init__(folder, lambda port: (
            f"    access_log {folder / 'access.log'};\n"
            f"    server {{\n        listen 127.0.0.1:{port};\n{locations}\n    }}"),
            health_path=f"{PREFIX}/health")
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}/"

    def paths_seen(self) -> list[str]:
        """The paths of the requests nginx received (its access log)."""
        return [line.split('"')[1].split()[1]
                for line in (self.folder / "access.log").read_text().splitlines() if '"' in line]


@pytest.fixture(scope="module")
def proxied(tmp_path_factory, model_path):
    """A Reame with root_path /reame, and nginx serving it at /reame/."""
    folder = tmp_path_factory.mktemp("proxy")
    server = start_server(folder, model_path=model_path, max_tokens=48,
                          server_extra=f"root_path = {PREFIX}\n")
    nginx = ProxyUnderPath(folder / "nginx", server.port)
    yield nginx
    nginx.stop()
    server.stop()
    shutil.rmtree(folder / "nginx", ignore_errors=True)


def test_the_page_works_under_the_path(proxied, page):  # noqa: F811
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    open_app(page, SimpleNamespace(url=proxied.url))
    reply = send(page, "What is the capital city of France? Answer in one word.")
    assert reply.strip()
    assert page.locator(BOT).count() == 1
    # The chat's address is under the path, and opens it.
    expect(page).to_have_url(f"{proxied.url}?chat={current_id(page)}")
    open_app(page, SimpleNamespace(url=proxied.url), f"?chat={current_id(page)}")
    expect(page.locator(BOT)).to_have_count(1)
    origin = f"http://127.0.0.1:{proxied.port}"
    ours = [u for u in requests if u.startswith(origin)]
    assert ours and all(u.startswith(proxied.url) for u in ours), (
        [u for u in ours if not u.startswith(proxied.url)])
    # (Chromium asks for /favicon.ico at the site's root by itself: not a request of the page.)
    outside = [p for p in proxied.paths_seen()
               if not p.startswith(PREFIX + "/") and p != "/favicon.ico"]
    assert not outside, outside


def test_a_streamed_send_through_gradio_client(proxied):
    client = ApiClient(proxied.url, verbose=False)
    chat_id = client.predict(api_name="/new_chat")
    job = client.submit(chat_id, "Name three colours of the rainbow.", api_name="/send")
    job.result(timeout=120)
    updates = job.outputs()
    assert len(updates) > 2, "the reply came in several updates"
    stored = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"] and stored[1]["content"]


def test_a_streamed_v1_reply_through_the_openai_sdk_arrives_as_it_is_written(proxied):
    sdk = OpenAI(base_url=proxied.url + "v1", api_key="unused", max_retries=0)
    model = sdk.models.list().data[0].id
    arrivals = []
    for chunk in sdk.chat.completions.create(
            model=model, stream=True, temperature=0, max_tokens=48,
            messages=[{"role": "user", "content": "Tell me about lighthouses."}]):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
    ended = time.perf_counter()
    assert len(arrivals) > 10
    # Buffered by the proxy, every chunk would arrive at the end, at once. Streamed, they are
    # spread over the reply's writing (a ratio of this run's own times: any CPU).
    assert arrivals[-1] - arrivals[0] > 0.5 * (ended - arrivals[0])
