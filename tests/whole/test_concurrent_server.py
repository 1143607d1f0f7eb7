"""Several people at once on a real server process: the named API, /v1 and the page.

Each person gets the reply they would get alone and never another's words; a short question is
answered while a long reply streams; past the line of waiting turns, /v1 answers 429 with
Retry-After and the named API says the server is full; the page shows a turn's place in line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser is a fixture
    BOT,
    BOX,
    REPLY_TIMEOUT,
    STOP,
    browser,
    new_chat,
    open_app,
    wait_for_reply_done,
    without_stats,
)
from tests.conftest import Server, at_once, start_server
from tests.gradio_api import ApiClient
from tests.reference import assert_answers, model_answer
from tests.web.v1.test_openai import model_id, sdk

WORDS = ["PELICAN", "TORNADO", "MARMALADE", "VIOLIN", "GLACIER", "PUMPKIN", "SAXOPHONE",
         "CACTUS"]
LONG = "Write a long story about a dragon who learns to sing."
COUNT_TO_500 = "Write the numbers from 1 to 500, separated by commas."


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    """4 slots (the default), greedy replies of at most 24 tokens, each reply's tokens
    decoded as if alone ([model] exact_under_load): replies under load are compared with
    replies alone, bit for bit (by default they are decoded together, tests/inference/test_concurrent.py)."""
    server = start_server(tmp_path_factory.mktemp("together"), model_path=model_path,
                          max_tokens=24, exact_under_load=True)
    yield server
    server.stop()


def ask_v1(server: Server, text: str, max_tokens: int = 24) -> str:
    stream = sdk(server).chat.completions.create(
        model=model_id(server), messages=[{"role": "user", "content": text}], temperature=0,
        max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def ask_named(server: Server, text: str) -> str:
    client = ApiClient(server.url, verbose=False)
    chat = client.predict(api_name="/new_chat")
    return client.predict(chat, text, api_name="/send")


@pytest.mark.slow
def test_eight_people_on_the_api_and_v1_each_get_their_own_reply(server):
    asks = [f"Repeat this word exactly once: {w}" for w in WORDS]
    routes = [ask_v1, ask_named] * 4  # half through /v1, half through the named API
    alone = [route(server, ask) for route, ask in zip(routes, asks)]
    together = at_once([lambda r=route, a=ask: r(server, a) for route, ask in zip(routes, asks)])
    assert together == alone  # greedy: the same reply as alone, whoever else was talking
    for reply, word in zip(together, WORDS):
        assert [w for w in WORDS if w != word and w in reply.upper()] == [], reply


@pytest.mark.slow
def test_a_short_question_is_answered_while_a_long_reply_streams(server):
    stream = sdk(server).chat.completions.create(
        model=model_id(server), messages=[{"role": "user", "content": LONG}], temperature=0,
        max_tokens=300, stream=True)
    chunks = iter(stream)
    next(chunks)
    assert_answers(ask_named(server, "What is the capital of France?"),
                   model_answer("What is the capital of France?"))
    rest = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(rest) > 50  # the story went on after the answer (it did not wait for it)


def test_beyond_the_line_v1_answers_429_and_the_api_says_full(tmp_path, model_path):
    server = start_server(tmp_path, model_path=model_path, max_tokens=400, slots=1,
                          max_waiting=0)
    try:
        story = sdk(server).chat.completions.create(
            model=model_id(server), messages=[{"role": "user", "content": LONG}], temperature=0,
            stream=True)
        chunks = iter(story)
        next(chunks)  # the only slot is writing; nobody may wait
        request = urllib.request.Request(
            server.url + "v1/chat/completions", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"model": model_id(server),
                             "messages": [{"role": "user", "content": "Hi"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 429
        assert int(refused.value.headers["Retry-After"]) > 0
        error = json.loads(refused.value.read())["error"]
        assert error["code"] == "server_full" and "full" in error["message"]
        client = ApiClient(server.url, verbose=False)
        chat = client.predict(api_name="/new_chat")
        with pytest.raises(Exception, match="full"):
            client.predict(chat, "Hi", api_name="/send")
        story.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_the_page_shows_a_turn_its_place_in_line(browser, tmp_path, model_path):
    # The first reply must outlast the second page's opening however busy the machine: a
    # story can end in 300 tokens (it did, beside another test worker), a count to 500 runs
    # on until the Stop below.
    server = start_server(tmp_path, model_path=model_path, max_tokens=1500, slots=1)
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    try:
        first, second = (c.new_page() for c in contexts)
        for page in (first, second):
            page.set_default_timeout(REPLY_TIMEOUT)
        open_app(first, server)
        new_chat(first)
        first.locator(BOX).fill(COUNT_TO_500)
        first.locator(BOX).press("Enter")
        expect(first.locator(STOP)).to_be_visible()
        expect(first.locator(BOT).last).not_to_be_empty()  # its reply is being written
        # (New chat only now: an empty chat is reused, and the first one is not empty.) The
        # second page opens on the chat being written and follows it (its Stop shows) before
        # New chat is clicked, as a person would see it first. Clicked in the moment before
        # the following began, its first chunk could land over the new chat (seen once in
        # CI: the following had not started, so New chat had nothing to cancel).
        open_app(second, server)
        expect(second.locator(STOP)).to_be_visible()
        new_chat(second)
        second.locator(BOX).fill("What is the capital of France?")
        second.locator(BOX).press("Enter")
        expect(second.locator(".reame-queued")).to_have_text(
            "Waiting for a free slot: 1st in line…")
        first.locator(STOP).click()  # the slot is free at once: the second reply is written
        wait_for_reply_done(second, 1)
        expect(second.locator(".reame-queued")).to_have_count(0)
        assert_answers(without_stats(second.locator(BOT).last.inner_text()),
                       model_answer("What is the capital of France?"))
        wait_for_reply_done(first, 1)
    finally:
        for context in contexts:
            context.close()
        server.stop()
