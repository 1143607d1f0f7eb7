"""Chaos: for a minute, clients do everything at random to a 2-slot server; then it is whole.

Loopback only, bounded in time (CHAOS_S) and in count (each worker's actions are bounded by the
time and by their own timeouts). Worker threads send, stream and hang up at random moments (before
the first token, mid-prompt, mid-reply), stop reading, send whole requests, send and cancel
named-API jobs; the page (in the main thread: Playwright's) sends, presses Stop or Esc, switches
chats and makes new ones; the model is switched once, halfway. At the end: no turn active or
waiting, every chat in the database whole (no message without its chat or its parent, every
shown branch present), every KV file whole, and a new turn answered in under 5 s.
The seed is printed: a failure is replayed with REAME_CHAOS_SEED.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError

from reame.inference.kv import kvfile
from reame.inference.kv.blobs import FolderBlobs

from tests.browser_helpers import BOX, CHATS, browser, open_app  # noqa: F401 - browser: a fixture
from tests.conftest import FULL, start_server
from tests.gradio_api import ApiClient
from tests.server_metrics import metric
from tests.web.http.test_disconnect import LONG, LONG_PROMPT, read_until

# Seconds of chaos; the model switch comes halfway. make test: 12 s (20 s kept both cores busy
# for 37 s of the suite's worker time; 12 s made 28 actions of 9 kinds on a loaded machine),
# make test-full (FULL): 60 s.
CHAOS_S = 60 if FULL else 12
# Tokens of a chaos reply: long enough to be hung up on mid-reply; make test keeps them short,
# as the requests still running at the chaos's end (on Gemma 3 after the switch) are waited for.
REPLY_TOKENS = 120 if FULL else 48
WORKERS = 4
STALL_S = 3
NEXT_WITHIN_S = 30.0  # loose: the failure this tells apart is forever


def model_id(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        return json.loads(conn.getresponse().read())["data"][0]["id"]
    finally:
        conn.close()


def v1_socket(port: int, text: str, *, stream: bool, rcvbuf: int | None = None):
    import socket

    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"model": model_id(port), "messages": [{"role": "user", "content": text}],
                       "stream": stream, "max_tokens": REPLY_TOKENS, "temperature": 0.7}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def whole_request(port: int, text: str, max_tokens: int = 16) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({
            "model": model_id(port), "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0}), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        return answer.status, time.monotonic() - started
    finally:
        conn.close()


class Chaos:
    def __init__(self, port: int, url: str, seed: int, deadline: float):
        self.port, self.url, self.deadline = port, url, deadline
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.done: dict[str, int] = {}
        self.errors: list[str] = []

    def pick(self, choices):
        with self.lock:
            return self.rng.choice(choices)

    def wait(self, low: float, high: float) -> None:
        with self.lock:
            pause = self.rng.uniform(low, high)
        time.sleep(pause)

    def count(self, name: str) -> None:
        with self.lock:
            self.done[name] = self.done.get(name, 0) + 1

    # the workers' actions

    def hang_up(self) -> None:
        sock = v1_socket(self.port, self.pick([LONG, LONG_PROMPT, "Say hi."]),
                         stream=self.pick([True, False]))
        self.wait(0, 2.5)  # before its first token, mid-prompt or mid-reply
        sock.close()

    def stop_reading(self) -> None:
        sock = v1_socket(self.port, LONG, stream=True, rcvbuf=1024)
        try:
            head = read_until(sock, b"\r\n", timeout=60)
            if b" 200 " not in head:  # refused (full, a model loading): nothing to stall
                return
            read_until(sock, b"data: ", timeout=60)
            self.wait(1, STALL_S + 2)
        finally:
            sock.close()

    def whole(self) -> None:
        status, _ = whole_request(self.port, self.pick(["Say hi.", "Name a fruit."]))
        if status not in (200, 429, 503):
            raise AssertionError(f"a whole request got {status}")

    def named(self, cancel: bool) -> None:
        client = ApiClient(self.url, verbose=False)
        try:
            chat = client.predict(api_name="/new_chat")
            job = client.submit(chat, self.pick([LONG, LONG_PROMPT]), api_name="/send")
            if cancel:
                self.wait(0, 2.5)
                job.cancel()
            else:
                try:
                    job.result(timeout=120)
                except Exception as exc:  # noqa: BLE001 - a full server or a switch may refuse
                    if "full" not in str(exc) and "replaced" not in str(exc):
                        raise
        finally:
            client.close()

    def work(self) -> None:
        actions = [("hang_up", self.hang_up), ("stop_reading", self.stop_reading),
                   ("whole", self.whole), ("named_cancel", lambda: self.named(True)),
                   ("named_send", lambda: self.named(False))]
        while time.monotonic() < self.deadline:
            name, action = self.pick(actions)
            try:
                action()
                self.count(name)
            except Exception as exc:  # noqa: BLE001 - reported at the end
                with self.lock:
                    self.errors.append(f"{name}: {exc!r}")


def page_chaos(page, chaos: Chaos) -> None:
    """The page's share: send, then Stop, Esc, switch chats or wait; sometimes a new chat."""
    while time.monotonic() < chaos.deadline:
        try:
            box = page.locator(BOX)
            box.fill(chaos.pick([LONG, LONG_PROMPT, "Hello!"]))
            box.press("Enter")
            chaos.wait(0.2, 2.5)
            what = chaos.pick(["stop", "esc", "switch", "new", "wait"])
            if what == "stop":
                page.locator("#message [data-testid=stop-button]").click(timeout=3000)
            elif what == "esc":
                box.press("Escape")
            elif what == "switch" and page.locator(CHATS).count() > 1:
                page.locator(CHATS).nth(chaos.pick([0, 1])).click()
            elif what == "new":
                page.click("#new-chat")
            else:
                chaos.wait(0, 3)
            chaos.count(f"page_{what}")
            chaos.wait(0.2, 1)
        except PlaywrightError as exc:  # a click that found the page elsewhere: go on
            chaos.count("page_miss")
            if "Target closed" in str(exc):
                raise


def chats_are_whole(database: Path) -> list[str]:
    problems = []
    with sqlite3.connect(database) as db:
        for (orphan,) in db.execute(
                "SELECT id FROM message WHERE chat_id NOT IN (SELECT id FROM chat)"):
            problems.append(f"message {orphan} has no chat")
        for (orphan,) in db.execute(
                "SELECT m.id FROM message m WHERE m.parent_id IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM message p WHERE p.id = m.parent_id AND p.chat_id = m.chat_id)"):
            problems.append(f"message {orphan} has no parent in its chat")
        for (chat,) in db.execute(
                "SELECT c.id FROM chat c WHERE c.leaf_id IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM message m WHERE m.id = c.leaf_id AND m.chat_id = c.id)"):
            problems.append(f"chat {chat} shows a message it does not hold")
    return problems


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_leaves_the_server_whole(tmp_path, model_path, gemma_path, browser):
    seed = int(os.environ.get("REAME_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"chaos seed {seed} (replay with REAME_CHAOS_SEED={seed})")
    server = start_server(tmp_path / "chaos", model_path=model_path, slots=2, max_tokens=REPLY_TOKENS,
                          n_ctx=2048, max_waiting=4,
                          server_extra=f"stalled_reply_s = {STALL_S}\n")
    try:
        chaos = Chaos(server.port, server.url, seed, time.monotonic() + CHAOS_S)
        workers = [threading.Thread(target=chaos.work, daemon=True) for _ in range(WORKERS)]
        for worker in workers:
            worker.start()

        def switch_model() -> None:
            time.sleep(CHAOS_S / 2)
            ApiClient(server.url, verbose=False).predict(
                {"model": {"model_path": str(gemma_path)}}, api_name="/update_settings")
            chaos.count("model_switch")

        switcher = threading.Thread(target=switch_model, daemon=True)
        switcher.start()
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.set_default_timeout(15_000)
        page = context.new_page()
        open_app(page, server)
        page_chaos(page, chaos)
        context.close()
        for thread in (*workers, switcher):
            thread.join(150)
            assert not thread.is_alive(), "a chaos worker is stuck"
        print("chaos did:", dict(sorted(chaos.done.items())))
        assert chaos.done.get("model_switch") == 1
        assert not chaos.errors, chaos.errors
        # Every turn has ended: abandoned ones within the stall bound.
        deadline = time.monotonic() + STALL_S + NEXT_WITHIN_S
        while (metric(server, "reame_turns_active") or metric(server, "reame_turns_waiting")) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(server, "reame_turns_active") == 0
        assert metric(server, "reame_turns_waiting") == 0
        assert chats_are_whole(tmp_path / "chaos" / "sessions" / "reame.db") == []
        kv = tmp_path / "chaos" / "sessions" / "kv"
        broken = {f.name: kvfile.problem(FolderBlobs(kv), f.name) for f in kv.glob("*.kv")}
        assert {name: why for name, why in broken.items() if why} == {}
        status, took = whole_request(server.port, "Say hi.", max_tokens=8)
        assert status == 200 and took < NEXT_WITHIN_S, (status, took)
    finally:
        server.stop()
