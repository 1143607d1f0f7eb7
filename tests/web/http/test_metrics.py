"""GET /metrics on real servers, read with prometheus_client's own parser: turns, tokens
evaluated vs restored, latency histograms, cache hits by source, KV files, rejected files, the
line, the model's load time, requests by API; and who may read it when accounts are on."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.accounts.test_accounts import guarded  # noqa: F401 - a fixture: a server with accounts
from tests.conftest import start_server
from tests.gradio_api import ApiClient


def scrape(server, headers: dict | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample of GET /metrics, by (name, sorted labels)."""
    request = urllib.request.Request(server.url + "metrics", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def status_of(server, headers: dict) -> int:
    request = urllib.request.Request(server.url + "metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def kv_files(folder: Path) -> list[Path]:
    return sorted((folder / "sessions" / "kv").glob("*.kv"))


@pytest.mark.slow
def test_metrics_count_turns_tokens_latency_cache_and_files(tmp_path, model_path):
    server = start_server(tmp_path, model_path=model_path, max_tokens=16)
    try:
        before = scrape(server)
        assert value(before, "reame_model_loaded") == 1
        assert value(before, "reame_model_load_seconds") > 0
        assert value(before, "reame_turns_waiting") == 0
        assert value(before, "reame_slots") == 4

        gradio = ApiClient(server.url, verbose=False)
        kept = gradio.predict(api_name="/new_chat")
        gradio.predict(kept, "Name three colours of the rainbow.", api_name="/send")
        gradio.predict(kept, "And two more.", api_name="/send")  # its KV is live
        lost = gradio.predict(api_name="/new_chat")
        gradio.predict(lost, "What is a lighthouse for?", api_name="/send")
        sdk = OpenAI(base_url=server.url + "v1", api_key="unused")
        streamed = list(sdk.chat.completions.create(
            model=sdk.models.list().data[0].id, stream=True, temperature=0,
            messages=[{"role": "user", "content": "Say hello."}]))
        assert streamed

        after = scrape(server)
        assert value(after, "reame_turns_total", kind="chat", outcome="done") == 3
        assert value(after, "reame_turns_total", kind="stateless", outcome="done") == 1
        assert value(after, "reame_cache_hits_total", source="live") >= 1
        assert value(after, "reame_prompt_tokens_total", how="evaluated") > 0
        assert value(after, "reame_prompt_tokens_total", how="live") > 0
        assert value(after, "reame_first_token_seconds_count") == 4
        assert value(after, "reame_first_token_seconds_sum") > 0
        assert value(after, "reame_token_seconds_count") > 4, "one per gap between tokens"
        assert value(after, "reame_http_requests_total", api="v1", code="2xx") == 2  # + models
        assert value(after, "reame_http_requests_total", api="metrics", code="2xx") == 1
        assert value(after, "reame_http_requests_total", api="gradio_api", code="2xx") > 0
        server.stop()  # every queued KV write lands first (SIGTERM)
        lost_file = next(p for p in kv_files(tmp_path) if p.name.startswith(f"chat-{lost}-"))
        lost_file.write_bytes(b"not a KV file" + lost_file.read_bytes()[13:])

        server.start()
        at_start = scrape(server)  # nothing is being written: the files as they are
        on_disk = kv_files(tmp_path)
        assert value(at_start, "reame_kv_files") == len(on_disk) >= 2
        assert value(at_start, "reame_kv_disk_bytes") == sum(p.stat().st_size for p in on_disk)
        gradio = ApiClient(server.url, verbose=False)
        gradio.predict(kept, "One last colour?", api_name="/send")  # restored from its file
        gradio.predict(lost, "Who keeps it?", api_name="/send")  # its file is rejected
        restarted = scrape(server)
        assert value(restarted, "reame_cache_hits_total", source="disk") == 1
        assert value(restarted, "reame_prompt_tokens_total", how="restored") > 0
        assert value(restarted, "reame_kv_rejected_files_total") == 1
        assert value(restarted, "reame_recompute_seconds_saved") > 0
    finally:
        server.stop()


def test_with_accounts_metrics_are_for_an_admin_key_or_this_machine(guarded):  # noqa: F811
    server, keys = guarded
    assert status_of(server, {}) == 200, "a local request that no proxy forwarded"
    for forwarded in ({"X-Forwarded-For": "203.0.113.9"}, {"X-Real-IP": "203.0.113.9"},
                      {"Forwarded": "for=203.0.113.9"}):
        assert status_of(server, forwarded) == 403, forwarded
    forwarded = {"X-Forwarded-For": "203.0.113.9"}
    assert status_of(server, {**forwarded, "Authorization": f"Bearer {keys['bob']}"}) == 403
    assert status_of(server, {**forwarded, "Authorization": "Bearer sk-reame-wrong"}) == 403
    assert status_of(server, {**forwarded, "Authorization": f"Bearer {keys['alice']}"}) == 200
    assert value(scrape(server, {"Authorization": f"Bearer {keys['alice']}"}),
                 "reame_model_loaded") == 1
