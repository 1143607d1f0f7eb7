"""Tool calls in the page: a stored chat whose reply called a tool (an agent's turn through
/v1 with X-Reame-Chat) shows the call folded under the reply, "Called get_weather(...)", its
result inside, never the call's raw markup and never the result as a message of its own; the
page goes on from it."""

from __future__ import annotations

import json

from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - fixtures
    BOT,
    REPLY_TIMEOUT,
    USER,
    api,
    browser,
    open_app,
    page,
    server,
)
from tests.inference.test_tools import ANSWER_TOKENS, ASK, RESULT, TOOLS, model_of, sdk


def test_a_call_and_its_result_are_folded_under_the_reply(server, page):
    client, model = sdk(server), model_of(server)
    chat_id = api(server).predict(api_name="/new_chat")
    header = {"X-Reame-Chat": str(chat_id)}
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=0,
                                           extra_headers=header)
    calls = first.choices[0].message.tool_calls
    client.chat.completions.create(
        model=model, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=ANSWER_TOKENS,
        messages=[{"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in calls],
        extra_headers=header)

    open_app(page, server, f"?chat={chat_id}")
    expect(page.locator(BOT)).to_have_count(2, timeout=REPLY_TIMEOUT)  # the results: no row
    expect(page.locator(USER)).to_have_count(1)
    folded = page.locator(BOT).first.locator("details.reame-call")
    expect(folded).to_have_count(len(calls))
    for n, call in enumerate(calls):
        given = ", ".join(f"{key}={json.dumps(value)}"
                          for key, value in json.loads(call.function.arguments).items())
        expect(folded.nth(n).locator("summary")).to_have_text(
            f"Called {call.function.name}({given})")
        expect(folded.nth(n).locator("pre")).to_be_hidden()  # folded
    folded.first.locator("summary").click()
    expect(folded.first.locator("pre")).to_have_text(RESULT)
    chat_text = page.locator("#chatbot").inner_text()
    assert "<tool_call>" not in chat_text and "tool_call" not in chat_text, chat_text
