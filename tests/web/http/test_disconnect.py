"""Every turn ends, whatever its caller does: a 1-slot server stays usable.

A real server process with one slot. Each test makes a caller go away in another manner — a /v1
client that hangs up before, during and after its prompt, one that stops reading, a cancelled
gradio_client job — and then checks that another request on that one slot is answered, and,
counted in /metrics, that the abandoned turn ended "stopped" instead of running to its end
("done") while the next one waited. Counts, not times: the same on any CPU. Replies that must
be long ban the model's end tokens (logit_bias), so no CPU's rounding ends them early.
In-process tests check the scheduler's bound for a caller that stops asking, and close().
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from reame.inference.engine import Engine
from reame.runtime import service_over

from tests.conftest import GREEDY, THREADS, Server, start_server
from tests.gradio_api import ApiClient
from tests.server_metrics import metric, settle

LONG = "Write a very long story about a dragon who learns to sing, with many chapters."
# About 1,500 tokens of prompt: 6-10 s to evaluate on 2 cores, in about a hundred decodes.
LONG_PROMPT = ("Here is a list of facts. " + " ".join(
    f"Fact {i}: the river number {i} flows into lake number {i + 7}." for i in range(95))
    + " Summarize the facts.")
# What "at once" means here: without the fix these waits are forever (a turn nobody asks for
# never ends), so a loose bound tells them apart on a slow or busy CPU too.
ENDS_WITHIN_S = 30.0
STALL_S = 2
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    """One slot, replies of up to 400 tokens, a caller that asks for nothing for 2 s is gone."""
    server = start_server(tmp_path_factory.mktemp("disconnect"), model_path=model_path,
                          slots=1, max_tokens=400, n_ctx=2048,
                          server_extra=f"stalled_reply_s = {STALL_S}\n")
    yield server
    server.stop()


def v1_body(text: str, *, stream: bool, max_tokens: int = 400,
            logit_bias: dict[str, float] | None = None) -> bytes:
    return json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": text}],
                       "stream": stream, "max_tokens": max_tokens, "temperature": 0,
                       **({"logit_bias": logit_bias} if logit_bias else {})}).encode()


@pytest.fixture(scope="module")
def no_end(model_path) -> dict[str, float]:
    """A logit_bias that bans the model's end tokens: a reply that goes on to max_tokens
    whatever the CPU makes of it."""
    engine = Engine(model_path, n_ctx=256, n_threads=THREADS)
    try:
        return {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}
    finally:
        engine.close()


def open_v1(server: Server, text: str, *, stream: bool = True, rcvbuf: int | None = None,
            logit_bias: dict[str, float] | None = None, max_tokens: int = 400
            ) -> socket.socket:
    """A raw connection that has sent a /v1 request (and read nothing)."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", server.port))
    body = v1_body(text, stream=stream, logit_bias=logit_bias, max_tokens=max_tokens)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 60) -> bytes:
    sock.settimeout(timeout)
    seen = b""
    while marker not in seen:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection before {marker!r}: {seen[-300:]!r}"
        seen += chunk
    return seen


def next_answer_s(server: Server) -> float:
    """Seconds a new short /v1 request takes to be answered whole (the only slot must be
    free for it)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", v1_body("Say hi.", stream=False, max_tokens=8),
                 {"Content-Type": "application/json"})
    answer = conn.getresponse()
    assert answer.status == 200, answer.read()
    json.loads(answer.read())
    conn.close()
    return time.monotonic() - started


def outcomes(server: Server, kind: str = "stateless") -> dict[str, float]:
    return {outcome: metric(server, "reame_turns_total", kind=kind, outcome=outcome)
            for outcome in ("done", "stopped")}


def ended(server: Server, before: dict[str, float], kind: str = "stateless") -> dict[str, int]:
    """Once no turn is active: how many turns ended since before, by outcome."""
    settle(server, timeout=120)
    after = outcomes(server, kind)
    return {k: int(after[k] - before[k]) for k in after}


# Counted, not timed, so that any CPU gives the same answer: the abandoned turn must end
# "stopped" (without the fix it runs to its end, "done", while the next request waits), and the
# next request must be answered (its HTTP timeout is the bound).


@pytest.mark.parametrize("tokens_read", [0, 1, 20])
def test_a_v1_stream_closed_mid_reply_frees_the_slot(server, no_end, tokens_read):
    before = outcomes(server)
    sock = open_v1(server, LONG, logit_bias=no_end)
    for _ in range(tokens_read):
        read_until(sock, b"\n\n")  # one event (the first is the role alone)
    sock.close()
    next_answer_s(server)
    counted = ended(server, before)
    # Closed before its prompt was evaluated, a turn may not have begun at all.
    assert counted == {"done": 1, "stopped": 1 if tokens_read else counted["stopped"]}
    assert counted["stopped"] <= 1, counted


# Anthropic's Messages and OpenAI's Responses, streamed: their own bodies and events, the same
# turns underneath. Neither API has logit_bias: the story prompt writes hundreds of tokens and
# the client hangs up after a few events, long before any CPU's reply could end.
AGENT_APIS = {
    "/v1/messages": {"model": "m", "max_tokens": 400, "temperature": 0, "stream": True,
                     "messages": [{"role": "user", "content": LONG}]},
    "/v1/responses": {"model": MODEL_NAME, "max_output_tokens": 400, "temperature": 0,
                      "stream": True, "input": LONG},
}


@pytest.mark.parametrize("path", sorted(AGENT_APIS))
def test_an_agent_api_stream_closed_mid_reply_frees_the_slot(server, path):
    before = outcomes(server)
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps(AGENT_APIS[path]).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                 + b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    seen = b""
    for _ in range(4):  # the stream's opening events and the first words
        seen += read_until(sock, b"\n\n")
    assert b"delta" in seen, seen[-300:]
    sock.close()
    next_answer_s(server)
    assert ended(server, before) == {"done": 1, "stopped": 1}


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_during_a_long_prompt_stops_it(server, stream):
    before = outcomes(server)
    sock = open_v1(server, LONG_PROMPT, stream=stream)
    time.sleep(1.0)  # the prompt is being evaluated: no byte of the reply yet
    sock.close()
    next_answer_s(server)
    assert ended(server, before) == {"done": 1, "stopped": 1}


@pytest.mark.slow
def test_a_client_that_stops_reading_does_not_keep_the_slot(server, no_end):
    # A tiny receive window, and the client reads nothing after the first event, nor closes.
    # Over loopback the kernel's send buffer grows to megabytes, so the whole reply usually
    # fits in the buffers and the turn ends "done"; where they fill first (a slow link), the
    # server's writes wait, the turn is asked for nothing more, and the stall bound stops it
    # (its own test: test_a_stream_dropped_without_closing_is_ended_after_the_bound). Either
    # way the slot is free while the socket is still open.
    before = outcomes(server)
    sock = open_v1(server, LONG, rcvbuf=1024, logit_bias=no_end)
    read_until(sock, b"data: ")
    try:
        next_answer_s(server)
        counted = ended(server, before)
    finally:
        sock.close()
    assert counted["done"] + counted["stopped"] == 2, counted


def test_a_cancelled_gradio_client_job_frees_the_slot(server):
    client = ApiClient(server.url, verbose=False)
    chat = client.predict(api_name="/new_chat")
    before = outcomes(server, "chat")
    job = client.submit(chat, LONG_PROMPT, api_name="/send")
    time.sleep(1.5)  # mid-prompt
    job.cancel()
    next_answer_s(server)
    assert ended(server, before, "chat") == {"done": 0, "stopped": 1}
    kept = client.predict(chat, api_name="/get_chat")["messages"]
    # The message is kept; a reply stopped before its first token keeps nothing else.
    assert kept[0]["content"] == LONG_PROMPT and all(m["role"] in ("user", "assistant")
                                                     for m in kept)


def test_a_stop_does_not_wait_for_open_pages_or_streamed_replies(server, no_end):
    """An open page or API client always holds a stream (Gradio's heartbeat), and a reply
    may be streaming: SIGTERM ends them as hang-ups and the server stops at once, not after
    uvicorn's graceful timeout (5 s, logged as exceeded). The module's last use of `server`."""
    client = ApiClient(server.url, verbose=False)
    client.predict(api_name="/new_chat")  # its heartbeat stream is open
    sock = open_v1(server, LONG, logit_bias=no_end)
    read_until(sock, b"data: ")  # the reply is streaming
    started = time.monotonic()
    server.process.terminate()
    server.process.wait(timeout=60)
    took = time.monotonic() - started
    sock.close()
    assert "graceful shutdown exceeded" not in server.log_path.read_text()
    assert took < 5, f"the stop took {took:.1f} s"


# In-process: the scheduler's bound on a caller that stops asking.


@pytest.fixture(scope="module")
def engine1(model_path) -> Engine:
    engine = Engine(model_path, n_ctx=2048, slots=1, n_threads=THREADS)
    yield engine
    engine.close()


def test_a_stream_dropped_without_closing_is_ended_after_the_bound(tmp_path, engine1):
    service = service_over(tmp_path, engine1, GREEDY.changed(max_tokens=200), stall_s=0.5)
    try:
        chat = service.new_chat()
        held = service.send(chat.id, LONG)
        first = next(held)
        while not first.text:  # a token, not a place in line
            first = next(held)
        # The caller holds its stream and asks for nothing more (a dropped reference that the
        # garbage collector has not met yet, a stuck thread).
        started = time.monotonic()
        other = service.send(service.new_chat().id, "Say hi.")
        assert next(other).queued == 1  # the only slot is held
        assert next(other).text  # its first token: the held turn was ended
        waited = time.monotonic() - started
        assert waited < 0.5 + ENDS_WITHIN_S
        other.close()
        stopped = service.messages(chat.id)[-1]
        assert stopped.role == "assistant" and stopped.stopped
        assert stopped.content.startswith(first.text.strip())
        assert service.scheduler.busy == 0
    finally:
        service.close()


def test_close_stops_turns_under_way_and_abandoned_ones(tmp_path, engine1):
    service = service_over(tmp_path, engine1, GREEDY.changed(max_tokens=400), stall_s=60)
    chat = service.new_chat()
    held = service.send(chat.id, LONG)
    next(held)  # under way, then abandoned: its caller never asks again
    waiting = service.send(service.new_chat().id, "Say hi.")
    assert next(waiting).queued == 1
    started = time.monotonic()
    service.close()  # a shutdown: it must not wait for either caller
    assert time.monotonic() - started < ENDS_WITHIN_S
    assert service.messages(chat.id)[-1].stopped
    assert list(waiting) == []  # ended without a word: nothing of it was stored
