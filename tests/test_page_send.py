"""Sending in a real browser: a reply streams in and ends with its stats line, stop keeps the
partial reply, the user's HTML is shown as text while markdown renders, an empty or too-long
message is given back; and a missing model explained on the page (which writes
docs/screenshots/missing-model.png).

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; the missing-model test starts its own).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect

from reame.chats.service import title_from

from .browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    CAPITAL,
    ERROR_BADGE,
    REPLY_TIMEOUT,
    SCREENSHOTS,
    STATS,
    STATS_TAIL,
    STOP,
    SUBMIT,
    TOAST,
    TOOLS_LINE,
    UI_TIMEOUT,
    USER,
    api,
    browser,
    current_chat,
    current_id,
    first_words_after_enter,
    new_chat,
    open_app,
    open_panel_and_type,
    page,
    reload,
    selected_title,
    send,
    server,
    wait_for_reply_done,
    without_stats,
    words,
)
from .conftest import Server, start_server


def test_a_reply_streams_into_the_page_and_ends_with_its_stats_line(page, server):
    open_app(page, server)
    new_chat(page)
    # Record the reply's length at every change of the chat, and whether the stats are there.
    page.evaluate("""() => {
        window.__samples = [];
        new MutationObserver(() => {
            const bots = document.querySelectorAll('#chatbot [data-testid=bot]');
            if (!bots.length) return;
            const last = bots[bots.length - 1];
            window.__samples.push([last.innerText.trim().length,
                                   !!last.querySelector('.reame-stats')]);
        }).observe(document.querySelector('#chatbot'),
                   {subtree: true, childList: true, characterData: true});
    }""")
    prompt = "Write a short story about a cat."
    box = page.locator(BOX)
    box.fill(prompt)
    box.press("Enter")

    # The user's bubble shows at once, long before the reply is done; the textbox is cleared
    # and its send button became a stop button.
    expect(page.locator(USER)).to_have_text([prompt], timeout=UI_TIMEOUT)
    assert page.locator(STATS).count() == 0, "the user's bubble came only with the whole reply"
    expect(box).to_have_value("")
    expect(page.locator(STOP)).to_be_visible()

    wait_for_reply_done(page, 1)
    samples = page.evaluate("window.__samples")
    streamed = {length for length, done in samples if length and not done}
    assert len(streamed) >= 2, f"the reply did not grow while streaming: {samples}"
    shown = page.locator(BOT).inner_text()
    stats = page.locator(STATS).inner_text()
    assert TOOLS_LINE.sub("", shown).endswith(stats) and STATS_TAIL.search(stats), (shown,
                                                                                 stats)
    assert len(without_stats(shown)) >= max(streamed), "the final reply is shorter than a chunk"
    assert selected_title(page) == title_from(prompt), "the chat is titled from its message"

    chat = current_chat(server, title_from(prompt))
    user, reply = chat["messages"]
    assert (user["role"], user["content"]) == ("user", prompt)
    assert reply["role"] == "assistant" and not reply["stopped"]
    assert f"{reply['stats']['generated']} tokens at" in stats
    assert words(reply["content"]) == words(without_stats(shown))


def test_stop_keeps_the_partial_reply_and_the_chat_goes_on(page, server):
    open_app(page, server)
    new_chat(page)
    # A long reply: raise this chat's max tokens in its settings panel, typed as soon as the
    # panel opens, and send at once. The panel saves on blur, and that save may arrive after
    # the send: the send carries the panel's values, so a value typed just before sending is
    # never lost.
    max_tokens = page.locator("#max-tokens input")
    expect(max_tokens).to_have_value("64")  # the panel holds this chat's settings
    expect(max_tokens).to_be_hidden()  # in a closed panel
    open_panel_and_type(page, "#chat-settings", "#max-tokens input", "400")
    box = page.locator(BOX)
    box.fill("Write a long story about a dragon.")
    box.press("Enter")
    bot = page.locator(BOT)
    expect(bot).to_have_count(1, timeout=REPLY_TIMEOUT)
    # Past the server's default of 64 tokens: the 400 typed a moment ago applies to it.
    client = api(server)
    chat_id = current_id(page)
    try:
        page.wait_for_function(
            "sel => (document.querySelector(sel)?.innerText || '').length > 400", arg=BOT,
            timeout=REPLY_TIMEOUT)
    except Exception:  # say what was lost where
        stored = client.predict(chat_id, api_name="/get_chat")
        raise AssertionError(
            f"the reply stopped short: field {max_tokens.input_value()!r}, stored max_tokens "
            f"{stored['max_tokens']}, reply stats {stored['messages'][-1].get('stats')}, "
            f"reply {len(bot.inner_text())} characters") from None
    expect(page.locator(STOP)).to_be_visible()
    assert client.predict(chat_id, api_name="/get_chat")["max_tokens"] == 400
    # Enter while the reply streams keeps the message in the box and says why (no error);
    # Esc stops the reply, and typing goes on in the box.
    box.fill(CAPITAL)
    box.press("Enter")
    expect(page.locator("#reame-hint")).to_have_text(re.compile(
        "^A reply is being written: your message stays here until it ends"))
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(page.locator(TOAST)).to_have_count(0)
    expect(page.locator(USER)).to_have_count(1)
    expect(page.locator(STATS)).to_have_count(0)
    expect(box).to_have_value(CAPITAL)
    box.press("Escape")

    # The partial reply stays, now with its stats line saying it was stopped.
    wait_for_reply_done(page, 1)
    stats = page.locator(STATS).inner_text()
    assert "stopped" in stats, stats
    partial = without_stats(bot.inner_text())
    assert partial, "the partial reply disappeared"
    expect(box).to_have_value(CAPITAL)
    expect(box).to_be_focused()

    stored = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["stopped"] is True
    assert 0 < stored[1]["stats"]["generated"] < 400
    assert words(stored[1]["content"]) == words(partial)

    # After a reload the stopped reply is still there: it was stored.
    reload(page)
    expect(page.locator(USER)).to_have_text(["Write a long story about a dragon."])
    expect(page.locator(STATS)).to_have_count(1)
    assert "stopped" in page.locator(STATS).inner_text()
    assert words(without_stats(page.locator(BOT).inner_text())) == words(partial)

    # And the chat goes on.
    shown = send(page, CAPITAL)
    assert without_stats(shown), "no reply after the stopped one"
    expect(page.locator(USER)).to_have_count(2)
    stored = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [(m["role"], m.get("stopped")) for m in stored] == [
        ("user", None), ("assistant", True), ("user", None), ("assistant", False)]


def test_user_html_is_shown_as_text_and_markdown_renders(page, server):
    open_app(page, server)
    new_chat(page)
    page.evaluate("delete window.__pwned")
    attack = '<img src=x onerror="window.__pwned=1"><b>bold?</b>'
    send(page, attack)
    user = page.locator(USER).last
    expect(user).to_contain_text("<b>bold?</b>")
    assert attack in user.inner_text()
    assert user.locator("b, img").count() == 0
    assert page.locator("#chatbot img").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    # The reply (at greedy, cut by max_tokens inside a code fence) ends with its stats line as
    # a line of text, not as raw HTML inside the code block.
    expect(page.locator(STATS)).to_have_count(1)
    expect(page.locator("#chatbot")).not_to_contain_text("reame-stats")

    # Markdown renders: checked on the user's bubble, which shows at once (the reply is stopped).
    box = page.locator(BOX)
    box.fill("**strong** and `code`")
    box.press("Enter")
    user = page.locator(USER).nth(1)
    expect(user.locator("strong")).to_have_text("strong")
    expect(user.locator("code")).to_have_text("code")
    expect(page.locator(BOT).nth(1)).not_to_have_text("", timeout=REPLY_TIMEOUT)
    # Stop the reply if it still streams (it may be short): clicked in the page, in one step.
    page.evaluate(f"document.querySelector('{STOP}')?.click()")
    wait_for_reply_done(page, 2)
    assert page.locator("#chatbot img").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"

    stored = current_chat(server, title_from(attack))["messages"]
    assert [m["content"] for m in stored[::2]] == [attack, "**strong** and `code`"]


def test_an_empty_message_sends_nothing(page, server):
    open_app(page, server)
    new_chat(page)
    chats_before = api(server).predict(api_name="/list_chats")
    box = page.locator(BOX)
    hint = page.locator("#message").get_by_text("Type a message first.")

    box.fill("")
    box.press("Enter")
    expect(hint).to_be_visible()
    expect(page.locator(USER)).to_have_count(0)
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(page.locator(SUBMIT)).to_be_visible()
    assert api(server).predict(api_name="/list_chats") == chats_before, "something was stored"
    assert selected_title(page) == "New chat"

    # A real message is sent as usual, and the hint goes away.
    question = "What is the capital city of Spain? Answer in one word."
    send(page, question)
    expect(hint).to_have_count(0)
    expect(page.locator(USER)).to_have_text([question])

    # Only spaces and newlines: nothing either.
    box.fill("   \n  ")
    box.press("Enter")
    expect(hint).to_be_visible()
    expect(page.locator(USER)).to_have_text([question])
    expect(page.locator(BOT)).to_have_count(1)
    assert len(current_chat(server, title_from(question))["messages"]) == 2


def test_a_message_too_long_for_the_model_is_given_back(page, server):
    open_app(page, server)
    new_chat(page)
    too_long = "word " * 3000  # about 3,000 tokens; the context holds 2,048
    box = page.locator(BOX)
    box.fill(too_long)
    box.press("Enter")
    expect(page.locator(TOAST).filter(has_text="Shorten it and send again")).to_be_visible()
    expect(box).to_have_value(too_long)
    expect(page.locator(USER)).to_have_count(0)
    expect(page.locator(SUBMIT)).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    chat_id = current_id(page)
    assert api(server).predict(chat_id, api_name="/get_chat")["messages"] == []


def test_a_missing_model_is_explained_and_sending_fails_clearly(page, model_path):
    # A short folder name: the path shows in the screenshot. Its models/ holds the real model.
    with tempfile.TemporaryDirectory(prefix="reame-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        (folder / "models" / model_path.name).symlink_to(model_path)
        server = start_server(folder, model_path="models/does-not-exist.gguf")
        try:
            check_missing_model_page(page, server, folder, model_path.name)
        finally:
            server.stop()


def check_missing_model_page(page: Page, server: Server, folder: Path, model_name: str):
    open_app(page, server)
    error = page.locator("#model-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("The model could not be loaded")
    expect(error).to_contain_text(str(folder / "models" / "does-not-exist.gguf"))
    expect(error).to_contain_text(model_name)  # what the models folder holds
    expect(page.locator("#model-info")).to_have_count(0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "missing-model.png", full_page=True)

    box = page.locator(BOX)
    box.fill("Hello?")
    box.press("Enter")
    refusal = page.locator("#message").get_by_text("The model could not be loaded")
    expect(refusal).to_be_visible()
    expect(refusal).to_contain_text("does-not-exist.gguf")
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(box).to_have_value("Hello?")  # the text is kept
    expect(box).to_be_editable()
    expect(page.locator(USER)).to_have_count(0)
    client = api(server)
    assert client.predict(api_name="/list_chats") == []

    # The server is still up and the page still works.
    new_chat(page)
    assert [c["title"] for c in client.predict(api_name="/list_chats")] == ["New chat"]


def test_a_reply_cut_at_max_tokens_says_so(page, server):
    """A reply that ended at the chat's Max tokens, not by the model, says it was cut (it
    looked finished); one that the model ended does not."""
    client = api(server)
    chat_id = client.predict("Cut short", None, api_name="/new_chat")
    client.predict(chat_id, "Write a long story about a dragon, chapter by chapter.",
                   api_name="/send")
    client.predict(chat_id, "Say hi.", api_name="/send")
    replies = [m for m in client.predict(chat_id, api_name="/get_chat")["messages"]
               if m["role"] == "assistant"]
    limit = client.predict(chat_id, api_name="/get_chat")["max_tokens"]
    assert replies[0]["stats"]["generated"] == limit, "a long story outlasts the limit"
    open_app(page, server)
    stats = page.locator(STATS)
    expect(stats).to_have_count(2)
    expect(stats.nth(0)).to_contain_text(f"cut at the limit of {limit} tokens")
    if replies[1]["stats"]["generated"] < limit:
        expect(stats.nth(1)).not_to_contain_text("cut at the limit")


def test_continue_makes_a_cut_reply_go_on_reusing_its_kv(page, server):
    """Continue under the last reply, when it was cut at Max tokens: the same reply goes on in
    the same bubble (it starts with the words it had), only the last token or so is evaluated
    again, and the cut reply stays as its version 1/2."""
    client = api(server)
    chat_id = client.predict("Continue me", None, api_name="/new_chat")
    client.predict(chat_id, "Write a long story about a dragon, chapter by chapter.",
                   api_name="/send")
    cut = client.predict(chat_id, api_name="/get_chat")["messages"][1]
    assert cut["stats"]["at_limit"]
    open_app(page, server)
    page.locator(f"#chat-list [data-chat='{chat_id}'] .reame-open").click()
    expect(page.locator(STATS)).to_have_count(1)
    expect(page.locator(STATS)).to_contain_text("cut at the limit")
    continue_button = page.locator("#chatbot button.reame-tool", has_text="Continue")
    expect(continue_button).to_have_count(1)
    continue_button.click()
    expect(page.locator("#chatbot .reame-version-of")).to_have_text("2/2",
                                                                     timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 1)
    reply = client.predict(chat_id, api_name="/get_chat")["messages"][1]
    assert reply["id"] != cut["id"] and reply["content"].startswith(cut["content"])
    assert len(reply["content"]) > len(cut["content"])
    assert reply["stats"]["prefilled"] <= 1, reply["stats"]
    assert words(without_stats(page.locator(BOT).inner_text())) == words(reply["content"])


def test_the_first_token_figure_counts_from_the_message_s_arrival(page, server):
    """The stats line's first token is what the person waited, from the message's arrival
    (begin_send), not from the turn's start on its slot (which said 0.00 s after a message
    typed ahead, while the person had waited half a second): at least the server's own
    figure, and no more than the browser's own wait from Enter to the first words."""
    open_app(page, server)
    new_chat(page)
    browser_wait = first_words_after_enter(page, "Name three colours.")
    wait_for_reply_done(page, 1)
    stats = api(server).predict(current_id(page), api_name="/get_chat")["messages"][1]["stats"]
    assert stats["waited_s"] >= stats["first_token_s"] > 0, stats
    assert stats["waited_s"] <= browser_wait + 0.05, (stats, browser_wait)
    expect(page.locator(STATS)).to_contain_text(f"first token {stats['waited_s']:.2f} s")
