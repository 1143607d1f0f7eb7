"""The page as a person on a slow machine uses it: Esc while a long prompt is still being
evaluated stops it there, what was evaluated is kept for the next message, and the next message
is answered.

Counted, not timed (any CPU): the server's /metrics say how the turn ended and where the next
one's prompt came from. Without the stop, the prompt would run to its end and a reply would
follow (outcome "done"); without keeping what was evaluated, the next turn would find nothing
live.
"""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser, page, server are fixtures
    BOX,
    CURRENT,
    REPLY_TIMEOUT,
    STOP,
    api,
    browser,
    current_id,
    new_chat,
    open_app,
    page,
    server,
    wait_for_reply_done,
)
from tests.server_metrics import metric, settle

# About 650 tokens: a few seconds to evaluate even on a fast CPU, in some forty decodes (the
# next message evaluates what Esc left of it, so a longer one only makes the test slower).
LONG_PROMPT = ("Here is a list of facts. " + " ".join(
    f"Fact {i}: the river number {i} flows into lake number {i + 7}." for i in range(40))
    + " Summarize the facts.")


def counts(server) -> dict[str, float]:
    return {"stopped": metric(server, "reame_turns_total", kind="chat", outcome="stopped"),
            "done": metric(server, "reame_turns_total", kind="chat", outcome="done"),
            "live": metric(server, "reame_prompt_tokens_total", how="live"),
            "evaluated": metric(server, "reame_prompt_tokens_total", how="evaluated")}


def test_esc_during_a_long_prompt_stops_it_and_the_next_message_is_answered(page, server):
    open_app(page, server)
    new_chat(page)
    box = page.locator(BOX)
    chat_id = current_id(page) if page.locator(CURRENT).count() else None
    settle(server, timeout=60)
    before = counts(server)
    box.fill(LONG_PROMPT)
    box.press("Enter")
    client = api(server)
    deadline = time.monotonic() + 60
    while True:  # its turn has begun: the message is stored, its ~650 tokens evaluated
        chat_id = chat_id or current_id(page)
        if client.predict(chat_id, api_name="/get_chat")["messages"]:
            break
        assert time.monotonic() < deadline, "the message was never stored"
        time.sleep(0.05)
    time.sleep(0.3)  # a few of its ~40 decodes
    box.press("Escape")
    expect(page.locator(STOP)).to_have_count(0, timeout=REPLY_TIMEOUT)
    settle(server, timeout=60)
    after_stop = counts(server)
    assert after_stop["stopped"] == before["stopped"] + 1, (before, after_stop)
    assert after_stop["done"] == before["done"], "the long prompt was answered: Esc did not stop it"
    evaluated = after_stop["evaluated"] - before["evaluated"]
    assert evaluated > 0, "nothing of the prompt was evaluated before Esc"
    # Stopped before its first token: the message is kept, no reply.
    kept = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in kept] == ["user"] and kept[0]["content"] == LONG_PROMPT

    box.fill("Say hi.")
    box.press("Enter")
    wait_for_reply_done(page, 1)
    settle(server, timeout=60)
    after = counts(server)
    assert after["done"] == before["done"] + 1
    # The next turn started from what the stopped one had evaluated (kept live in its slot).
    assert after["live"] - after_stop["live"] >= evaluated - 16, (evaluated, after_stop, after)
    texts = page.locator("#chatbot [data-testid=user]").all_inner_texts()
    assert texts[-1].strip() == "Say hi." and any(re.search("Fact 1", t) for t in texts)
