"""Replies that go on while the page shows something else, in a real browser: switching chats,
making a new one or reloading never stops a reply; the list marks the chat being written;
coming back shows the reply so far and goes on streaming; Stop stays the way to stop it; a
closed tab stops it after the stall bound ([server] stalled_reply_s, STALL_S here).

Each test counts how turns ended through /metrics (`reame_turns_total{kind="chat"}`), so a
reply stopped behind the page's back shows even when the text looks whole.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    CHATS,
    CURRENT,
    REPLY_TIMEOUT,
    STATS,
    STOP,
    USER,
    api,
    browser,
    open_app,
    page,
    reload,
    wait_for_reply_done,
    wait_until,
    without_stats,
)
from tests.conftest import Server, start_server
from tests.web.http.test_disconnect import metric

# A reply that lasts: SmolLM2 writes numbers on and on (greedy; 1,200 tokens and more, also
# under a system prompt in French), so that it is still being written when the test looks;
# max_tokens bounds it (15 s and more on 2 cores).
COUNTER = "You are a helpful assistant."
COUNT = "Write the numbers from 1 to 500, separated by commas."
LONG_TOKENS = 1500
WRITING = "#chat-list .reame-row[data-writing=true]"
# The stall bound of this module's server: a reload must come back within it (a second or two
# even on a busy machine), and the closed tab's test waits it out. The shared page server's
# 15 s made that test wait 15 s with a core busy writing the reply nobody watched.
STALL_S = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    """A server of its own: the page server's, with a shorter stall bound."""
    server = start_server(tmp_path_factory.mktemp("live"), model_path=model_path,
                          max_tokens=64, server_extra=f"stalled_reply_s = {STALL_S}")
    yield server
    server.stop()


def outcomes(server) -> dict[str, float]:
    return {outcome: metric(server, "reame_turns_total", kind="chat", outcome=outcome)
            for outcome in ("done", "stopped")}


def counting_chat(server, title: str) -> int:
    """A chat (made through the API) whose replies are long."""
    client = api(server)
    chat_id = client.predict(title, COUNTER, api_name="/new_chat")
    client.predict(chat_id, None, None, None, LONG_TOKENS, api_name="/update_chat")
    return chat_id


def open_chat(page, title: str) -> None:
    page.locator(CHATS).filter(has_text=title).click()
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text(title)


def start_counting(page, title: str) -> str:
    """Send COUNT in the chat titled title and wait for the reply's first words."""
    open_chat(page, title)
    box = page.locator(BOX)
    box.fill(COUNT)
    box.press("Enter")
    expect(page.locator(BOT)).to_have_count(1, timeout=REPLY_TIMEOUT)
    wait_until(lambda: len(page.locator(BOT).inner_text().strip()) >= 3,
               "the reply's first words")
    return page.locator(BOT).inner_text()


def reply_text(server, chat_id: int) -> dict | None:
    """The chat's stored reply once its turn ended (None while it is still being written: its
    row, written as it streams, is marked unfinished until its end)."""
    messages = api(server).predict(chat_id, api_name="/get_chat")["messages"]
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant" or (last["stats"] or {}).get("unfinished"):
        return None
    return last


def test_a_reply_goes_on_while_other_chats_are_shown(page, server):
    before = outcomes(server)
    counting = counting_chat(server, "Counting while away")
    api(server).predict("Quiet while counting", None, api_name="/new_chat")
    open_app(page, server)
    seen = start_counting(page, "Counting while away")

    # Away in another chat: it is shown, empty, with Send (not Stop); the list says where a
    # reply is being written.
    open_chat(page, "Quiet while counting")
    expect(page.locator(USER)).to_have_count(0)
    expect(page.locator(STOP)).to_have_count(0)
    expect(page.locator(WRITING)).to_have_count(1)
    expect(page.locator(WRITING)).to_contain_text("Counting while away")
    expect(page.locator(WRITING)).to_contain_text("writing a reply")
    # ... and in a new chat too.
    page.click("#new-chat")
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text("New chat")
    expect(page.locator(WRITING)).to_have_count(1)
    assert reply_text(server, counting) is None, "the reply was kept: it ended on the switch"

    # Back: the reply so far, still streaming (it grows), with Stop.
    open_chat(page, "Counting while away")
    expect(page.locator(USER)).to_have_text([COUNT])
    expect(page.locator(STOP)).to_be_visible()
    back = page.locator(BOT).inner_text()
    assert len(back) > len(seen), (seen, back)
    wait_until(lambda: len(page.locator(BOT).inner_text()) > len(back),
               "the reply goes on streaming after coming back")

    # Stop is what stops it: the reply is kept as far as it got, marked stopped.
    page.locator(BOX).press("Escape")
    wait_for_reply_done(page, 1)
    expect(page.locator(STATS)).to_contain_text("stopped")
    expect(page.locator(WRITING)).to_have_count(0)
    kept = reply_text(server, counting)
    assert kept is not None and kept["stopped"] is True, kept
    assert len(kept["content"]) >= len(without_stats(back).strip()) > 0
    after = outcomes(server)
    assert after["stopped"] == before["stopped"] + 1, (before, after)


def test_a_reply_ends_in_its_chat_while_another_is_shown(page, server):
    """A reply that ends while the page shows another chat: the list's mark goes away by
    itself, and the chat shows the reply whole (done, not stopped)."""
    before = outcomes(server)
    counting = counting_chat(server, "Counting to the end")
    api(server).predict(counting, None, None, None, 48, api_name="/update_chat")
    api(server).predict("Somewhere else", None, api_name="/new_chat")
    open_app(page, server)
    start_counting(page, "Counting to the end")
    open_chat(page, "Somewhere else")
    wait_until(lambda: reply_text(server, counting) is not None, "the reply ended",
               timeout=REPLY_TIMEOUT / 1000)
    expect(page.locator(WRITING)).to_have_count(0)  # the list's timer saw it end
    kept = reply_text(server, counting)
    assert kept["stopped"] is False, kept
    open_chat(page, "Counting to the end")
    wait_for_reply_done(page, 1)
    expect(page.locator(STATS)).not_to_contain_text("stopped")
    assert without_stats(page.locator(BOT).inner_text()).strip()
    after = outcomes(server)
    assert after["done"] >= before["done"] + 1 and after["stopped"] == before["stopped"]


def test_a_reload_follows_the_reply_and_a_closed_tab_stops_it_after_the_bound(browser, server):
    counting = counting_chat(server, "Counting through a reload")
    context = browser.new_context()
    page = context.new_page()
    try:
        open_app(page, server)
        start_counting(page, "Counting through a reload")
        before = outcomes(server)
        reload(page)
        open_chat(page, "Counting through a reload")
        expect(page.locator(STOP)).to_be_visible()
        grown = page.locator(BOT).inner_text()
        wait_until(lambda: len(page.locator(BOT).inner_text()) > len(grown),
                   "the reply goes on streaming after the reload")
        assert outcomes(server) == before, "the reload stopped the reply"

        # The tab closes: nobody watches the reply; it is stopped after the bound (STALL_S),
        # long before its 1,000 tokens.
        page.close()
        closed = time.monotonic()
        wait_until(lambda: reply_text(server, counting) is not None,
                   "the reply of a closed tab was stopped", timeout=60)
        waited = time.monotonic() - closed
    finally:
        context.close()
    kept = reply_text(server, counting)
    assert kept["stopped"] is True, (kept, waited)
    assert outcomes(server)["stopped"] == before["stopped"] + 1
