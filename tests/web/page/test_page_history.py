"""A chat's history in a real browser: kept across a reload and a server restart (then a
message typed ahead), its last reply retried with the history reused, an earlier message
edited; and a long chat's marker where the model's memory ends. Also writes
docs/screenshots/chat.png and long-chat.png.

The reload-and-restart test comes before the retry test: both start a chat with the same
question, and the first looks its chat up by that title on the shared server.
Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; the long-chat test starts its own).
"""

from __future__ import annotations

import re

from playwright.sync_api import expect

from reame.chats.service import title_from
from reame.inference.batches import KEPT_CHUNK

from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    BRANCH,
    CAPITAL,
    CHATS,
    EDIT,
    EDIT_BOX,
    EDIT_SUBMIT,
    ITALY,
    NEXT,
    PLANET,
    PREVIOUS,
    REPLY_TIMEOUT,
    RETRY,
    REUSED,
    SCREENSHOTS,
    STATS,
    STATS_DETAILS,
    STATS_TAIL,
    STATS_WORDS,
    USER,
    VERSIONS,
    api,
    browser,
    current_chat,
    current_id,
    new_chat,
    open_app,
    page,
    reload,
    selected_title,
    send,
    server,
    stats_figures,
    stored_stats_text,
    typed_ahead_call,
    wait_for_reply_done,
    wait_until,
    without_stats,
    words,
)
from tests.reference import assert_answers, model_answer


def test_a_chat_survives_a_reload_and_a_server_restart(page, server):
    open_app(page, server)
    new_chat(page)
    first = send(page, CAPITAL)
    assert_answers(without_stats(first), model_answer(CAPITAL, max_tokens=64))
    second = send(page, "Name three primary colors.")
    expected_users = [CAPITAL, "Name three primary colors."]
    expected_bots = [first, second]

    def check_shown():
        assert selected_title(page) == title_from(CAPITAL)
        expect(page.locator(USER)).to_have_text(expected_users)
        # (As shown: the stats line's figures are folded under Details.)
        expect(page.locator(BOT)).to_have_text(expected_bots, use_inner_text=True)
        expect(page.locator(STATS)).to_have_count(2)

    reload(page)
    check_shown()
    server.restart()
    reload(page)
    check_shown()
    stored = current_chat(server, page, title_from(CAPITAL))["messages"]
    assert [m["content"] for m in stored[::2]] == expected_users
    assert [words(m["content"]) for m in stored[1::2]] == [words(without_stats(b))
                                                            for b in expected_bots]
    # Continuing after the restart restores the chat's KV from its file, and what is typed is
    # evaluated while it is typed: sending leaves only the message's end to evaluate.
    box = page.locator(BOX)
    with page.expect_response(lambda r: typed_ahead_call(r, ITALY), timeout=60_000):
        box.press_sequentially(ITALY, delay=40)  # the page's call with all of it has answered
    box.press("Enter")
    wait_for_reply_done(page, 3)
    line = stats_figures(page)
    typed = re.match(r"restored [\d,]+ tokens from disk in \d+ ms · (\d+) evaluated while typing "
                     r"· prefilled (\d+) ", line)
    assert typed, line
    assert int(typed[1]) >= 4 and int(typed[2]) <= 8, line
    # In words: the history reloaded from disk, what recomputing it would have taken once the
    # prefill speed is known, the message read (most of it while typed).
    said = page.locator(STATS_WORDS).last.inner_text()
    assert re.match(r"Continued instantly: [\d,]+ earlier tokens reloaded from disk in [\d,.]+ "
                    r"m?s( \(recomputing them would take about [\d,.]+ m?s\))?\. Read your "
                    r"message in [\d.]+ m?s \(most of it while you typed\), wrote ", said), said
    print(f"\nafter a restart: {said}\n  Details: {line}")
    assert "Rome" in page.locator(BOT).last.inner_text()
    # The Cache panel's line, in plain words: the time saved (once the prefill speed is
    # measured: prompts of 32 tokens or more), else the tokens restored; the chats ready.
    expect(page.locator("#cache-stats .reame-cache-line")).to_have_text(re.compile(
        r"^(≈ [\d,.]+ (s|min|h) of recomputation saved|[\d,]+ tokens restored instead of "
        r"recomputed) · \d+ chats? ready to continue$"))
    expect(page.locator("#cache-stats details")).not_to_have_attribute("open", "")
    # Its figures outlive a restart: the tokens restored, those of this turn included.
    restored = page.locator("#cache-stats li").first.text_content()
    assert int(restored.split(" tokens")[0].replace(",", "")) > 0, restored
    server.restart()
    reload(page)
    assert page.locator("#cache-stats li").first.text_content() == restored

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "chat.png", full_page=True)


def test_retry_keeps_the_old_reply_as_a_version_and_reuses_the_history(page, server):
    open_app(page, server)
    new_chat(page)
    capital = without_stats(send(page, CAPITAL))
    assert_answers(capital, model_answer(CAPITAL, max_tokens=64))
    planet = model_answer(CAPITAL, capital, PLANET, max_tokens=64)
    assert_answers(without_stats(send(page, PLANET)), planet, n=1)
    client = api(server)
    chat_id = current_id(page)
    before = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["content"] for m in before[::2]] == [CAPITAL, PLANET]
    old_reply = before[-1]
    # Only the last reply has a retry button.
    expect(page.locator(RETRY)).to_have_count(1)

    page.locator(RETRY).click()

    def replaced():
        last = client.predict(chat_id, api_name="/get_chat")["messages"][-1]
        # (SQLite may give the new row the deleted one's id: compare creation times.)
        return (last["role"] == "assistant" and last["created_at"] > old_reply["created_at"]
                and last["stats"] and not last["stats"].get("unfinished"))

    wait_until(replaced, "the retried reply was not stored", timeout=REPLY_TIMEOUT / 1000)
    after = client.predict(chat_id, api_name="/get_chat")["messages"]
    new_reply = after[-1]
    # The last reply was replaced, not added to: the same two questions, two replies.
    assert [m["id"] for m in after[:-1]] == [m["id"] for m in before[:-1]]
    assert [m["role"] for m in after] == ["user", "assistant", "user", "assistant"]

    # The page shows the new reply with its own stats line, and nothing else changed.
    line = stored_stats_text(new_reply["stats"])
    expect(page.locator(STATS_DETAILS).last).to_have_text(line, timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 2)
    expect(page.locator(USER)).to_have_text([CAPITAL, PLANET])
    expect(page.locator(BOT)).to_have_count(2)
    assert_answers(without_stats(page.locator(BOT).last.inner_text()), planet, n=1)
    assert words(new_reply["content"]) == words(without_stats(page.locator(BOT).last.inner_text()))

    # It reused the whole history (the same prompt as the replaced reply's) instead of
    # recomputing it: only the prompt's last decode (one chunk at most) was evaluated again.
    stats = new_reply["stats"]
    assert stats["prompt_tokens"] == old_reply["stats"]["prompt_tokens"], (stats, old_reply)
    match = REUSED.match(line)
    assert match, line
    reused = int((match[1] or match[2]).replace(",", ""))
    assert reused == stats["reused"] and reused + stats["prefilled"] == stats["prompt_tokens"]
    assert stats["prefilled"] <= KEPT_CHUNK, stats  # the prompt's last decode, evaluated again

    reload(page)
    expect(page.locator(USER)).to_have_text([CAPITAL, PLANET])
    expect(page.locator(STATS_DETAILS)).to_have_text([stored_stats_text(after[1]["stats"]),
                                                      line])

    # The old reply is kept: ‹ 2/2 › under the new one steps back to it, and forth.
    expect(page.locator(VERSIONS)).to_have_text(["2/2"])
    expect(page.locator(NEXT)).to_have_class(re.compile("reame-off"))
    page.locator(PREVIOUS).click()
    expect(page.locator(VERSIONS)).to_have_text(["1/2"])
    expect(page.locator(STATS_DETAILS).last).to_have_text(
        stored_stats_text(old_reply["stats"]))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "branch.png")
    assert words(without_stats(page.locator(BOT).last.inner_text())) == words(
        old_reply["content"])
    assert client.predict(chat_id, api_name="/get_chat")["messages"][-1]["id"] == old_reply["id"]
    page.locator(NEXT).click()
    expect(page.locator(VERSIONS)).to_have_text(["2/2"])
    expect(page.locator(STATS_DETAILS).last).to_have_text(line)
    expect(page.locator(BOX)).to_be_focused()

    # A click while the one before is still being answered counts too: the chat opened from
    # the list, then ‹ before the server has answered the open (on a busy machine, a person's
    # pace: a CI run once lost such a ‹). Both happen, in their order.
    page.evaluate("""([row, previous]) => {
        document.querySelector(row).click();
        setTimeout(() => document.querySelector(previous).click(), 0);
    }""", [f"{CHATS}[aria-current=page]", PREVIOUS])
    expect(page.locator(VERSIONS)).to_have_text(["1/2"])
    expect(page.locator(STATS_DETAILS).last).to_have_text(
        stored_stats_text(old_reply["stats"]))


def test_branch_from_here_opens_a_new_chat_that_reuses_the_kv(page, server):
    open_app(page, server)
    new_chat(page)
    assert_answers(without_stats(send(page, CAPITAL)), model_answer(CAPITAL, max_tokens=64))
    send(page, PLANET)
    client = api(server)
    parent = client.predict(current_id(page), api_name="/get_chat")
    expect(page.locator(BRANCH)).to_have_count(2)
    page.locator(BRANCH).first.click()

    # A new chat, selected, with the messages up to the first reply.
    expect(page.locator(USER)).to_have_text([CAPITAL])
    expect(page.locator(BOT)).to_have_count(1)
    branch_title = f"{parent['title']} (branch)"
    assert selected_title(page) == branch_title
    expect(page.locator(BOX)).to_be_focused()
    branch = client.predict(current_id(page), api_name="/get_chat")
    assert branch["title"] == branch_title and branch["branched_from"] == parent["id"]

    # Its first turn evaluates only the new message: the history comes from the parent's KV
    # (still live in its slot, or its file), as its stats line says.
    send(page, "Name a colour.")
    stored = client.predict(branch["id"], api_name="/get_chat")["messages"]
    stats = stored[-1]["stats"]
    line = stored_stats_text(stats)
    expect(page.locator(STATS_DETAILS).last).to_have_text(line)
    assert re.match(r"(reused [\d,]+ tokens in memory|restored [\d,]+ tokens from the chat "
                    r"it branched from in [\d,]+ ms) · ", line), line
    history = client.predict(parent["id"], api_name="/get_chat")["messages"][1]["stats"]
    assert stats["reused"] >= history["prompt_tokens"], (stats, history)
    assert stats["prefilled"] == stats["prompt_tokens"] - stats["reused"] < 40
    # The parent chat is unchanged.
    assert [m["content"] for m in client.predict(parent["id"], api_name="/get_chat")[
        "messages"]][::2] == [CAPITAL, PLANET]


def test_editing_an_earlier_message_makes_a_new_version_of_what_followed_it(page, server):
    open_app(page, server)
    new_chat(page)
    first = "What is the capital city of Germany? Answer in one word."
    berlin = without_stats(send(page, first))
    assert_answers(berlin, model_answer(first, max_tokens=64))
    hello = send(page, "Say hello.")
    chat_id = current_id(page)
    # Each of the user's messages can be edited, and only those.
    expect(page.locator(EDIT)).to_have_count(2)

    edited = "Which planet do we live on?"
    page.locator(EDIT).first.click()
    box = page.locator(EDIT_BOX)
    expect(box).to_have_value(first)
    box.fill(edited)
    page.locator(EDIT_SUBMIT).click()

    # The edited message stays, everything after it is replaced by the answer to it.
    expect(page.locator(USER)).to_have_text([edited])
    wait_for_reply_done(page, 1)
    expect(page.locator(BOT)).to_have_count(1)
    reply = page.locator(BOT).inner_text()
    assert_answers(without_stats(reply), model_answer(edited, max_tokens=64))
    chat_view = page.locator("#chatbot")
    for gone in (first, berlin, "Say hello.", without_stats(hello)):
        expect(chat_view).not_to_contain_text(gone)
    line = stats_figures(page)
    assert STATS_TAIL.search(line), line

    stored = api(server).predict(chat_id, api_name="/get_chat")["messages"]
    assert [(m["role"], m["content"]) for m in stored[:1]] == [("user", edited)]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert words(stored[1]["content"]) == words(without_stats(reply))
    assert line == stored_stats_text(stored[1]["stats"])

    # After a reload the page shows the chat as stored: the edited text, the old one gone.
    reload(page)
    page.locator(CHATS).filter(has_text=title_from(first)).click()
    expect(page.locator(USER)).to_have_text([starting(edited)])  # then its ‹ 2/2 ›
    expect(page.locator(BOT)).to_have_text([reply], use_inner_text=True)
    for gone in (first, berlin, "Say hello."):
        expect(chat_view).not_to_contain_text(gone)

    # The old version is kept, with what followed it: ‹ 1/2 › steps back to it.
    expect(page.locator(VERSIONS)).to_have_text(["2/2"])
    page.locator(PREVIOUS).click()
    expect(page.locator(VERSIONS)).to_have_text(["1/2"])
    expect(page.locator(USER)).to_have_text([starting(first), "Say hello."])
    assert words(without_stats(page.locator(BOT).last.inner_text())) == words(
        without_stats(hello))


def starting(text: str) -> re.Pattern:
    """A message's text as shown, the buttons under it aside."""
    return re.compile(f"^{re.escape(text)}")


def test_a_long_chat_marks_where_the_model_s_memory_ends_and_keeps_every_message(
        page, server_factory, model_path):
    from tests.inference.test_long_chat import ANSWERS, FILLER, QUESTIONS

    server = server_factory(model_path=model_path, n_ctx=512, max_tokens=32)
    open_app(page, server)
    new_chat(page)
    marker = page.locator("#chatbot .reame-window")
    sent = []
    while not marker.count():
        assert len(sent) < 8, "the 512-token window should overflow within 8 turns"
        n = len(sent)
        sent.append(FILLER + QUESTIONS[n % 2])
        reply = send(page, sent[-1])
        assert ANSWERS[n % 2] in reply, reply
    line = stats_figures(page)
    assert "context shifted" in line and "nothing recomputed" in line, line
    expect(marker).to_have_count(1)
    expect(marker).to_have_text("⋯ earlier messages are outside the model's memory ⋯")

    def check_marker_place():
        messages = current_chat(server, page, selected_title(page))["messages"]
        inside = [m["in_window"] for m in messages]
        assert inside == sorted(inside) and not inside[0] and inside[-1]
        last_outside_reply = inside.index(True) // 2 - 1  # index among the replies
        expect(page.locator(BOT).nth(last_outside_reply).locator(".reame-window")).to_have_count(1)
        expect(page.locator(USER)).to_have_count(len(sent)), "every message is still shown"

    check_marker_place()
    reload(page)
    check_marker_place()
    page.locator("#chatbot .reame-window").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOTS / "long-chat.png")
