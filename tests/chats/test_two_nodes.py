"""Two Reame nodes behind nginx, with deploy/nginx-two-nodes.conf itself: one PostgreSQL
database (tests/postgres.py) and one KV folder for both (they run on one machine), nginx (Debian's)
routing the page and the named API by a cookie and /v1 by the chat.

The first test puts two small stand-in servers behind nginx (no model): a client and a chat
stay on their node, and move when it dies. The second runs real Reame nodes (the model): a chat
started through one node continues through the other from the KV file the first one wrote,
and both nodes show the same history.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, Server, start_server
from tests.gradio_api import ApiClient
from tests.nginx import Nginx
from tests.postgres import postgres  # noqa: F401 - fixture

EXAMPLE = ROOT / "deploy" / "nginx-two-nodes.conf"
EXAMPLE_NODES = ("192.0.2.11:7860", "192.0.2.12:7860")  # the addresses the example names
COOKIE = "reame_node"


class TwoNodes(Nginx):
    """nginx running the example with its nodes replaced by 127.0.0.1:<port> each. Its access
    log tells, for every request, the key it was hashed by and the node that answered."""

    def __init__(self, folder: Path, node_ports: list[int]):
        example = EXAMPLE.read_text()
        for address, port in zip(EXAMPLE_NODES, node_ports, strict=True):
            assert address in example
            example = example.replace(address, f"127.0.0.1:{port}")

        def http_body(port: int) -> str:
            assert example.count("listen 80;") == 1
            return (f"    log_format nodes "
                    f"'$reame_affinity|$reame_v1_key|$upstream_addr|$uri|$status';\n"
                    f"    access_log {folder / 'access.log'} nodes;\n"
                    + example.replace("listen 80;", f"listen 127.0.0.1:{port};"))

        super().__init__(folder, http_body, health_path="health")
        self.url = f"http://127.0.0.1:{self.port}/"

    def log(self) -> list[dict]:
        """The requests nginx passed on: key (page), v1_key, node (the last port tried), uri."""
        entries = []
        for line in (self.folder / "access.log").read_text().splitlines():
            key, v1_key, upstream, uri, status = line.split("|")
            node = upstream.split(",")[-1].strip().rpartition(":")[2]
            entries.append({"key": key, "v1_key": v1_key, "uri": uri, "status": status,
                            "node": int(node) if node.isdigit() else None})
        return entries

    def answered(self, match: Callable[[dict], bool], timeout: float = 5) -> list[dict]:
        """The log's entries that match, once there is one (nginx logs a request just after
        its answer has gone out)."""
        deadline = time.monotonic() + timeout
        while not (found := [entry for entry in self.log() if match(entry)]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return found

    def nodes_of(self, key: str) -> set[int]:
        """The nodes that answered the page's and named API's requests hashed by key."""
        return {e["node"] for e in self.answered(
            lambda e: e["key"] == key and not e["uri"].startswith("/v1/"))}

    def key_for(self, node: int) -> str:
        """A cookie value that nginx sends to node (found by asking for /health with some)."""
        for n in range(64):
            key = f"probe-{n}"
            fetch(self.url + "health", cookie=key)
            if self.nodes_of(key) == {node}:
                return key
        pytest.fail(f"no key of 64 hashes to the node on port {node}")



def fetch(url: str, *, cookie: str | None = None, body: dict | None = None,
          headers: dict | None = None) -> tuple[dict, dict]:
    """GET (or POST body as JSON) url; the JSON answer and the response's headers."""
    sent = dict(headers or {})
    if cookie is not None:
        sent["Cookie"] = f"{COOKIE}={cookie}"
    data = None
    if body is not None:
        data, sent["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data=data, headers=sent)
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read() or b"{}"), dict(answer.headers)


def given_key(headers: dict) -> str | None:
    """The reame_node cookie nginx gave in a response (None if it gave none)."""
    cookie = SimpleCookie(headers.get("Set-Cookie", ""))
    return cookie[COOKIE].value if COOKIE in cookie else None


class StandIn:
    """A stand-in node: answers any GET or POST with {"node": its port}."""

    def __init__(self):
        port = None

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"node": port}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_nginx_keeps_a_client_and_a_chat_on_their_node_and_moves_them_when_it_dies(tmp_path):
    stand_ins = [StandIn(), StandIn()]
    nginx = TwoNodes(tmp_path / "nginx", [s.port for s in stand_ins])
    try:
        # A new client gets a key; everything it asks for with it goes to the same node.
        answer, headers = fetch(nginx.url + "config")
        key, home = given_key(headers), answer["node"]
        assert key
        for path in ("config", "gradio_api/queue/join", "gradio_api/queue/data", ""):
            answer, headers = fetch(nginx.url + path, cookie=key)
            assert answer["node"] == home and given_key(headers) is None
        assert nginx.nodes_of(key) == {home}
        # Other clients' keys spread over both nodes.
        assert {fetch(nginx.url + "config", cookie=f"client-{n}")[0]["node"]
                for n in range(32)} == {s.port for s in stand_ins}

        # /v1: a chat's turns go to one node, whoever sends them; chats spread over both.
        def v1_node(chat: int, caller: str) -> int:
            return fetch(nginx.url + "v1/chat/completions", body={}, cookie=caller,
                         headers={"X-Reame-Chat": str(chat),
                                  "Authorization": f"Bearer {caller}"})[0]["node"]

        for chat in range(1, 5):
            assert len({v1_node(chat, caller) for caller in ("a", "b", "c")}) == 1
        placed = {chat: v1_node(chat, "a") for chat in range(1, 33)}
        assert set(placed.values()) == {s.port for s in stand_ins}

        # The node dies: its clients and chats go to the other one.
        dead = next(s for s in stand_ins if s.port == home)
        alive = next(s.port for s in stand_ins if s is not dead)
        dead.stop()
        assert fetch(nginx.url + "config", cookie=key)[0]["node"] == alive
        orphan = next(chat for chat, node in placed.items() if node == home)
        assert v1_node(orphan, "a") == alive
    finally:
        nginx.stop()
        for stand_in in stand_ins:
            stand_in.stop()


# With the real model, on real servers.


@pytest.fixture
def cluster(tmp_path, postgres, model_path):  # noqa: F811
    """Two Reame nodes on one PostgreSQL database and one KV folder, behind nginx."""
    database = postgres.create_database()
    kv = tmp_path / "kv"
    nodes: list[Server] = []
    nginx = None
    try:
        for name in ("a", "b"):
            nodes.append(start_server(
                tmp_path / name, model_path=model_path, max_tokens=24,
                extra=f"database_url = {database}\n\n[cache]\ndir = {kv}\n"))
        nginx = TwoNodes(tmp_path / "nginx", [node.port for node in nodes])
        yield SimpleNamespace(nodes=nodes, nginx=nginx, kv=kv, url=nginx.url)
    finally:
        if nginx is not None:
            nginx.stop()
        for node in nodes:
            node.stop()


def last_stats(client: ApiClient, chat_id: int) -> dict:
    return client.predict(chat_id, api_name="/get_chat")["messages"][-1]["stats"]


def settled_kv_file(kv: Path, chat_id: int, timeout: float = 60) -> Path:
    """The chat's KV file, once it is there and has not changed for a second (the node writes
    it in the background after the reply)."""
    deadline, seen, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        files = sorted(kv.glob(f"chat-{chat_id}-*.kv"))
        state = [(p, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()]
        if state != seen:
            seen, since = state, time.monotonic()
        elif state and time.monotonic() - since > 1.0:
            return files[0]
        time.sleep(0.1)
    pytest.fail(f"no settled KV file of chat {chat_id} in {kv}")


def v1_turn(url: str, chat_id: int, text: str) -> dict:
    """A turn of the stored chat through /v1 (X-Reame-Chat); the whole answer."""
    model = fetch(url + "v1/models")[0]["data"][0]["id"]
    return fetch(url + "v1/chat/completions", headers={"X-Reame-Chat": str(chat_id)},
                 body={"model": model, "temperature": 0, "max_tokens": 24,
                       "messages": [{"role": "user", "content": text}]})[0]


def test_a_chat_started_through_one_node_continues_through_the_other(cluster):
    nginx = cluster.nginx
    ports = [node.port for node in cluster.nodes]

    # Started by a new client through nginx: its cookie puts it on one node, for good.
    first = ApiClient(cluster.url, verbose=False)
    first_key = first.cookies[COOKIE]
    chat_id = first.predict("Geography", api_name="/new_chat")
    first.predict(chat_id, "Which planet do we live on?", api_name="/send")
    [home] = nginx.nodes_of(first_key)
    started = last_stats(first, chat_id)
    settled_kv_file(cluster.kv, chat_id)

    # Continued by a client whose cookie hashes to the other node: the KV file the first
    # node wrote in the shared folder, not a recomputed history.
    away = next(port for port in ports if port != home)
    away_key = nginx.key_for(away)
    second = ApiClient(cluster.url, verbose=False, httpx_kwargs={"cookies": {COOKIE: away_key}})
    second.predict(chat_id, "Say hello.", api_name="/send")
    assert nginx.nodes_of(away_key) == {away}
    moved = last_stats(second, chat_id)
    assert moved["source"] == "disk", moved
    assert moved["reused"] >= started["prompt_tokens"], (started, moved)
    assert moved["prefilled"] == moved["prompt_tokens"] - moved["reused"]
    assert moved["prefilled"] < 24, moved
    settled_kv_file(cluster.kv, chat_id)

    # Through /v1 with the chat's header: hashed by the chat, to either node; the history is
    # reused there (live, or from the file), never recomputed whole.
    answer = v1_turn(cluster.url, chat_id, "Name a colour.")
    v1_node = nginx.answered(lambda e: e["uri"] == "/v1/chat/completions")[-1]["node"]
    assert v1_node in ports and answer["reame"]["chat_id"] == chat_id
    assert answer["reame"]["source"] in ("live", "disk"), answer["reame"]
    assert answer["reame"]["reused"] >= started["prompt_tokens"], answer["reame"]

    # Both nodes, asked directly, show the same history.
    histories = [ApiClient(node.url, verbose=False).predict(chat_id, api_name="/get_chat")
                 ["messages"] for node in cluster.nodes]
    assert histories[0] == histories[1]
    assert [m["role"] for m in histories[0]] == ["user", "assistant"] * 3
    assert histories[0][-1]["content"].strip() == answer["choices"][0]["message"][
        "content"].strip()

    # The node the second client is on dies: nginx sends that client to the other node,
    # which continues the chat from the database and its KV (live or from the folder).
    cluster.nodes[ports.index(away)].stop()
    rescued = ApiClient(cluster.url, verbose=False, httpx_kwargs={"cookies": {COOKIE: away_key}})
    rescued.predict(chat_id, "Thank you.", api_name="/send")
    after = last_stats(rescued, chat_id)
    assert after["source"] in ("live", "disk"), after
    assert home in nginx.nodes_of(away_key)
    messages = rescued.predict(chat_id, api_name="/get_chat")["messages"]
    assert messages[:6] == histories[0] and len(messages) == 8
