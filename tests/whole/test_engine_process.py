"""The model in a process of its own ([model] engine_process): a fatal error inside llama.cpp
ends the turns under way, not the server. The engine's process is killed (SIGKILL: what
llama.cpp's abort does to a process, without needing a bug to trigger it) while one user's
reply streams: that stream ends with an error instead of hanging, /health answers at once,
the model is loaded again in a new process, and another user's next turn is answered by the
same server process. (A stored chat's reply cut so keeps what was shown, with Continue:
tests/chats/test_streaming_reply_kept.py.)"""

from __future__ import annotations

import http.client
import json
import socket
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.conftest import start_server
from tests.web.http.test_disconnect import LONG, no_end, read_until, v1_body  # noqa: F401

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def engine_process(server) -> psutil.Process:
    """The server's child that runs the model (`python -m reame.inference.remote.child`)."""
    for child in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if "reame.inference.remote.child" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("the server runs no engine process")


def health(server) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(server.url + "health", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read())


def ask(server, text: str, key: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", v1_body(text, stream=False, max_tokens=8),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


def stream(server, text: str, key: str, logit_bias: dict) -> socket.socket:
    """A raw connection that has sent a streamed /v1 request as key's user (read nothing)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = v1_body(text, stream=True, logit_bias=logit_bias)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    return sock


def test_a_killed_engine_process_ends_one_turn_and_the_server_serves_on(tmp_path, model_path,
                                                                       no_end):
    server = start_server(tmp_path, model_path=model_path, max_tokens=400, engine_process=True,
                          users={"alice": "alice-password-1", "bob": "bob-password-22"},
                          keys=True)
    alice, bob = server.keys["alice"], server.keys["bob"]
    try:
        pid = server.process.pid
        first = engine_process(server)
        status, answer = ask(server, "Say hello.", bob)  # bob was served before
        assert status == 200, answer
        sock = stream(server, LONG, alice, no_end)
        read_until(sock, b"data: {", timeout=60)  # the reply streams
        first.send_signal(signal.SIGKILL)
        killed = time.monotonic()

        # The stream ends (an error said in it, or the connection closed), never hangs.
        sock.settimeout(30)
        rest = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk or b"data: [DONE]" in rest + chunk:
                rest += chunk
                break
            rest += chunk
        sock.close()
        assert b"error" in rest, rest[-500:]
        assert time.monotonic() - killed < 30

        # /health answers at once, whatever it says meanwhile, then ok with the new process.
        started = time.monotonic()
        status, _ = health(server)
        assert time.monotonic() - started < 5 and status in (200, 503)
        deadline = time.monotonic() + 60
        while health(server)[0] != 200:
            assert time.monotonic() < deadline, health(server)
            time.sleep(0.2)
        second = engine_process(server)
        assert second.pid != first.pid

        # Another user's next turn is answered by the same server process.
        status, answer = ask(server, "Say hello.", bob)
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"].strip()
        assert server.process.pid == pid and server.process.poll() is None
    finally:
        server.stop()
