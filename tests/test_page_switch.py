"""The page as a person on a slow machine uses it: switch chats mid-reply, press Esc mid-prompt.

A reply keeps being written when another chat is opened: the list says "writing…", and coming
back shows the reply so far and goes on streaming to its end (not stopped). Esc while a long
prompt is still being evaluated stops it at once: the next message is answered without waiting
for that prompt.
"""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from .browser_helpers import (  # noqa: F401 - browser, page, server are fixtures
    BOT, BOX, CURRENT, REPLY_TIMEOUT, STOP, api, browser, current_id, new_chat, open_app,
    open_panel_and_type, page, server, wait_for_reply_done)
from .test_disconnect import LONG, LONG_PROMPT

WRITING = "#chat-list .reame-writing"


def long_replies(page) -> None:
    """This chat's replies of up to 400 tokens (the shared server's default is 64)."""
    open_panel_and_type(page, "#chat-settings", "#max-tokens input", "400")


def test_a_reply_goes_on_while_another_chat_is_open_and_streams_on_coming_back(page, server):
    open_app(page, server)
    new_chat(page)
    long_replies(page)
    box = page.locator(BOX)
    box.fill(LONG)
    box.press("Enter")
    page.wait_for_function("sel => (document.querySelector(sel)?.innerText || '').length > 40",
                           arg=BOT, timeout=REPLY_TIMEOUT)
    writing_id = current_id(page)
    page.click("#new-chat")  # away, mid-reply
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text("New chat")
    expect(page.locator(BOT)).to_have_count(0)
    row = page.locator(f'#chat-list .reame-row[data-chat="{writing_id}"]')
    expect(row.locator(".reame-writing")).to_have_text("writing…")
    time.sleep(1.0)  # it goes on meanwhile
    client = api(server)
    row.locator(".reame-open").click()  # back
    expect(page.locator(f'{CURRENT}')).to_have_attribute("data-reame-action",
                                                         f"open:{writing_id}")
    bot = page.locator(BOT)
    expect(bot).to_have_count(1)
    shown_then = len(bot.inner_text())
    expect(page.locator(STOP)).to_be_visible()  # it is still being written, and can be stopped
    page.wait_for_function(
        "([sel, n]) => (document.querySelector(sel)?.innerText || '').length > n",
        arg=[BOT, shown_then + 20], timeout=REPLY_TIMEOUT)  # streaming on
    wait_for_reply_done(page, 1)
    stored = client.predict(writing_id, api_name="/get_chat")["messages"][-1]
    assert stored["role"] == "assistant" and not stored["stopped"]
    assert len(stored["content"]) > shown_then
    expect(page.locator(WRITING)).to_have_count(0)


def test_esc_during_a_long_prompt_stops_it_and_the_next_message_is_answered(page, server):
    open_app(page, server)
    new_chat(page)
    box = page.locator(BOX)
    chat_id = current_id(page) if page.locator(CURRENT).count() else None
    box.fill(LONG_PROMPT)
    box.press("Enter")
    client = api(server)
    deadline = time.monotonic() + 60
    while True:  # its turn has begun: the message is stored, its ~1,500 tokens evaluated
        chat_id = chat_id or current_id(page)
        if client.predict(chat_id, api_name="/get_chat")["messages"]:
            break
        assert time.monotonic() < deadline, "the message was never stored"
        time.sleep(0.1)
    time.sleep(0.5)
    started = time.monotonic()
    box.press("Escape")
    expect(page.locator(STOP)).to_have_count(0, timeout=REPLY_TIMEOUT)
    box.fill("Say hi.")
    box.press("Enter")
    wait_for_reply_done(page, 1)
    took = time.monotonic() - started
    # Without the stop, "Say hi." waits behind the whole prompt (6-10 s here, minutes on a
    # slow machine); with it, only for its own reply of at most 64 tokens.
    assert took < 10, f"the next message took {took:.1f} s after Esc"
    texts = page.locator("#chatbot [data-testid=user]").all_inner_texts()
    assert texts[-1].strip() == "Say hi." and any(re.search("Fact 1", t) for t in texts)
