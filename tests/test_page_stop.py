"""The page as a person on a slow machine uses it: Esc while a long prompt is still being
evaluated stops it at once, and the next message is answered without waiting for that prompt.
"""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from .browser_helpers import (  # noqa: F401 - browser, page, server are fixtures
    BOX, CURRENT, REPLY_TIMEOUT, STOP, api, browser, current_id, new_chat, open_app, page,
    server, wait_for_reply_done)
from .test_disconnect import LONG_PROMPT


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
