"""Sending in a real browser: a reply streams in and ends with its stats line, stop keeps the
partial reply, the user's HTML is shown as text while markdown renders, an empty or too-long
message is given back; and a missing model explained on the page (which writes
docs/screenshots/missing-model.png).

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; the missing-model test starts its own).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect

from reame.chats.service import title_from

from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    BUSY,
    CAPITAL,
    ERROR_BADGE,
    REPLY_TIMEOUT,
    RETRY,
    SCREENSHOTS,
    STATS,
    STATS_DETAILS,
    STATS_TAIL,
    STATS_WORDS,
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
    stats_figures,
    stored_stats_text,
    wait_for_reply_done,
    wait_until,
    without_stats,
    words,
)
from tests.conftest import Server, start_server
from tests.page_events import fn_index


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
    said = page.locator(STATS_WORDS).inner_text()
    stats = stats_figures(page)
    assert TOOLS_LINE.sub("", shown).strip().endswith(f"{said} Details"), (shown, said)
    assert STATS_TAIL.search(stats), stats
    assert len(without_stats(shown)) >= max(streamed), "the final reply is shorter than a chunk"
    assert selected_title(page) == title_from(prompt), "the chat is titled from its message"

    chat = current_chat(server, page, title_from(prompt))
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
    # 1,500: long enough that the reply still streams when Enter is pressed below, on a fast
    # machine too (a fresh clone's run: 400 tokens ended first, 4.6 s after the send).
    open_panel_and_type(page, "#chat-settings", "#max-tokens input", "1500")
    box = page.locator(BOX)
    box.fill("Write a long story about a dragon.")
    box.press("Enter")
    bot = page.locator(BOT)
    expect(bot).to_have_count(1, timeout=REPLY_TIMEOUT)
    # Past the server's default of 64 tokens: the 1,500 typed a moment ago applies to it.
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
    assert client.predict(chat_id, api_name="/get_chat")["max_tokens"] == 1500
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
    said = page.locator(STATS_WORDS).inner_text()
    assert said.endswith("You stopped it."), said
    partial = without_stats(bot.inner_text())
    assert partial, "the partial reply disappeared"
    expect(box).to_have_value(CAPITAL)
    expect(box).to_be_focused()

    stored = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["stopped"] is True
    assert 0 < stored[1]["stats"]["generated"] < 1500
    assert words(stored[1]["content"]) == words(partial)

    # After a reload the stopped reply is still there: it was stored.
    reload(page)
    expect(page.locator(USER)).to_have_text(["Write a long story about a dragon."])
    expect(page.locator(STATS)).to_have_count(1)
    expect(page.locator(STATS_WORDS)).to_contain_text("You stopped it.")
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

    stored = current_chat(server, page, title_from(attack))["messages"]
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
    assert len(current_chat(server, page, title_from(question))["messages"]) == 2


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
    expect(stats.nth(0)).to_contain_text(f"Cut at the limit of {limit} tokens")
    if replies[1]["stats"]["generated"] < limit:
        expect(stats.nth(1)).not_to_contain_text("Cut at the limit")


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
    expect(page.locator(STATS_WORDS)).to_contain_text("Cut at the limit")
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


def test_a_reply_whose_event_failed_on_the_way_still_shows_its_end(page, server):
    """The server starts a Continue, but the page's request for it comes back as an error (a
    proxy's 502; in a fresh-clone CI run one failed mid-reply). Gradio 6 runs no .then
    after a failed event, and the page went on saying "writing a reply…" over the cut reply
    forever. Now it follows the reply again and shows it whole, as version 2/2."""
    client = api(server)
    chat_id = client.predict("Lost on the way", None, api_name="/new_chat")
    client.predict(chat_id, "Write a long story about a dragon, chapter by chapter.",
                   api_name="/send")
    open_app(page, server)
    page.locator(f"#chat-list [data-chat='{chat_id}'] .reame-open").click()
    expect(page.locator(STATS_WORDS)).to_contain_text("Cut at the limit")
    continue_event = fn_index(page.evaluate("() => window.gradio_config"),
                              "reame-continue-btn", "click")

    def answer_lost(route):
        if json.loads(route.request.post_data or "{}").get("fn_index") == continue_event:
            route.fetch()  # the server gets it and starts the reply
            route.fulfill(status=502, body="Bad Gateway")
        else:
            route.continue_()

    page.route("**/queue/join*", answer_lost)
    page.locator("#chatbot button.reame-tool", has_text="Continue").click()
    expect(page.locator("#chatbot .reame-version-of")).to_have_text("2/2",
                                                                     timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 1)
    expect(page.locator(f"#chat-list [data-chat='{chat_id}']")).not_to_contain_text("writing")
    reply = client.predict(chat_id, api_name="/get_chat")["messages"][1]
    assert words(without_stats(page.locator(BOT).inner_text())) == words(reply["content"])


def test_the_wait_shown_counts_from_the_press_of_enter_to_the_first_words(page, server):
    """Issue 30: the stats line's wait is what the person waited, from Enter to the first words
    on the screen, as the browser measures it (page.js tells the server), not from the turn's
    start on its slot ("first token 0.00 s" after half a second of waiting) nor from the
    message's arrival at the server (the way there and back left out): at least the wait this
    test measures in the browser itself, from the same Enter to the same first words."""
    open_app(page, server)
    new_chat(page)
    browser_wait = first_words_after_enter(page, "Name three colours.")
    wait_for_reply_done(page, 1)
    stats = api(server).predict(current_id(page), api_name="/get_chat")["messages"][1]["stats"]
    assert stats["waited_s"] >= browser_wait, (stats, browser_wait)
    assert stats["waited_s"] <= browser_wait + 1.0, "not the same wait"
    assert stats["waited_s"] >= stats["first_token_s"] > 0, stats
    from reame.web.page.render import seconds

    expect(page.locator(STATS_WORDS)).to_contain_text(re.compile(  # (typed ahead: filled)
        rf"Read your message in {re.escape(seconds(stats['waited_s']))}"
        r"( \(most of it while you typed\))?,"))
    expect(page.locator(STATS_DETAILS)).to_have_text(
        re.compile(rf" · first token {stats['waited_s']:.2f} s · "))
    print(f"\nEnter to the first words: {browser_wait:.3f} s in the test, "
          f"{stats['waited_s']:.3f} s said; the turn on its slot: {stats['first_token_s']:.3f} s")


def test_a_reply_shows_the_page_s_own_quiet_state_not_gradio_s_progress_text(page, server):
    """Issue 30: no "processing | 2.3/13.0s" of Gradio's over the chat (nor its timers over the
    list) while a reply is read and written: a quiet "Reading…" then "Writing…" under the
    message box, gone once the reply is done. Nor over a new chat: watched from before it is
    made (under load its event waited in Gradio's queue, and "queue: 1/1" flashed), nor the
    page load's timers, drawn late on a busy machine (seen once in CI)."""
    open_app(page, server)
    page.evaluate("""() => {
        window.__progress = new Set();
        window.__busy = [];
        new MutationObserver(() => {
            for (const text of document.querySelectorAll('.progress-text, .eta-bar')) {
                if (text.checkVisibility({opacityProperty: true, visibilityProperty: true})
                        && text.innerText.trim()) {
                    window.__progress.add(
                        `${text.closest('[id]')?.id}: ${text.innerText.trim()}`);
                }
            }
            const busy = document.querySelector('#reame-busy')?.textContent;
            if (busy && busy !== window.__busy[window.__busy.length - 1]) {
                window.__busy.push(busy);
            }
        }).observe(document.body, {subtree: true, childList: true, characterData: true,
                                   attributes: true});
    }""")
    new_chat(page)
    box = page.locator(BOX)
    box.fill("Write a short story about a cat.")
    box.press("Enter")
    wait_for_reply_done(page, 1)
    # A retry of the reply writes it again: the same quiet line, no progress text.
    page.evaluate("window.__busy.push('(retry)')")
    page.locator(RETRY).click()
    expect(page.locator("#chatbot .reame-version-of")).to_have_text("2/2",
                                                                     timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 1)
    progress = page.evaluate("[...window.__progress]")
    assert not progress, f"Gradio's progress text showed: {progress}"
    said = page.evaluate("window.__busy")
    assert said.index("(retry)") > 0 and said[said.index("(retry)") - 1] == "Writing…", said
    assert said[-1] in ("Writing…", ""), said
    assert "Writing…" in said[said.index("(retry)"):], said
    expect(page.locator(BUSY)).to_have_text("")
    expect(page.locator(BUSY)).to_have_attribute("role", "status")


def test_the_stats_line_says_what_happened_in_words_its_figures_under_details(page, server):
    """Issue 30: under a reply, what happened in words a person reads at a glance ("Read your
    message in 0.4 s, wrote 6 words in 0.3 s."; a chat continued: "Continued instantly: N
    earlier tokens still in memory ..."), singular and plural right; the figures (tokens,
    tok/s, prefill) only under a closed Details, which opens on a click."""
    open_app(page, server)
    new_chat(page)
    client = api(server)
    said = page.locator(STATS_WORDS)
    replies = []
    for n, question in enumerate((CAPITAL, "Name three colours.")):
        send(page, question)
        reply = client.predict(current_id(page), api_name="/get_chat")["messages"][-1]
        stats, line = reply["stats"], said.nth(n).inner_text()
        count = len(reply["content"].split())
        wrote = f"wrote {count} word{'' if count == 1 else 's'}"
        assert re.search(rf"Read your message in [\d.]+ m?s( \(most of it while you typed\))?, "
                         rf"{wrote}( in [\d.]+ m?s)?\.$", line), line
        for technical in ("prefill", "tok/s", "tokens at", "KV", "1 tokens"):
            assert technical not in line, line
        replies.append((reply, line))
    from reame.inference.turn import TurnStats
    from reame.web.page.render import stats_words

    for reply, line in replies:
        assert line == stats_words(TurnStats.from_dict(reply["stats"]), reply["content"]), line
    history = stats["reused"] - stats["typed_ahead"]
    assert line.startswith(f"Continued instantly: {history:,} earlier tokens "), line
    # A chat's first reply continued nothing: what it reused (if anything) is the opening
    # every chat shares (the system prompt), said so.
    first_stats, first_line = replies[0][0]["stats"], replies[0][1]
    assert first_stats["earlier_messages"] == 0 and stats["earlier_messages"] == 2, stats
    assert not first_line.startswith("Continued"), first_line
    if first_stats["reused"] - first_stats["typed_ahead"] > 0:
        assert first_line.startswith("Started from the chat's opening, "), first_line
    # The figures: under Details, closed, as the API's stats say them.
    figures = page.locator(STATS_DETAILS).last
    expect(figures).to_be_hidden()
    expect(figures).to_have_text(stored_stats_text(stats))
    page.locator(f"{STATS} summary").last.click()
    expect(figures).to_be_visible()
    assert STATS_TAIL.search(figures.inner_text()), figures.inner_text()


def test_continue_after_a_small_max_tokens_set_in_the_panel_and_stop_during_it(page, server):
    """Issue 30: Max tokens set small in the chat's settings cuts the reply, which says so in
    words, with Continue under it; with Max tokens raised, Continue makes the same reply go on
    in its bubble (its old words first, streamed, Stop showing), from its KV: a token or so
    evaluated again, not the chat. Esc stops it, kept, saying it was stopped."""
    open_app(page, server)
    new_chat(page)
    open_panel_and_type(page, "#chat-settings", "#max-tokens input", "12")
    box = page.locator(BOX)
    box.fill("Write a long story about a dragon, chapter by chapter.")
    box.press("Enter")
    wait_for_reply_done(page, 1)
    client, chat_id = api(server), current_id(page)
    cut = client.predict(chat_id, api_name="/get_chat")["messages"][1]
    assert cut["stats"]["at_limit"] and cut["stats"]["generated"] == 12, cut["stats"]
    expect(page.locator(STATS_WORDS)).to_contain_text(
        "Cut at the limit of 12 tokens (Max tokens, in the chat's settings).")
    continue_button = page.locator("#chatbot button.reame-tool", has_text="Continue")
    expect(continue_button).to_have_count(1)

    page.locator("#max-tokens input").fill("400")
    page.locator("#max-tokens input").press("Tab")  # saved on blur
    wait_until(lambda: client.predict(chat_id, api_name="/get_chat")["max_tokens"] == 400,
               "the new Max tokens was not saved")
    page.evaluate("""() => { window.__grown = []; new MutationObserver(() => {
        const bot = document.querySelector('#chatbot [data-testid=bot]');
        if (bot) window.__grown.push(bot.innerText.trim());
    }).observe(document.querySelector('#chatbot'),
               {subtree: true, childList: true, characterData: true}); }""")
    continue_button.click()
    expect(page.locator(STOP)).to_be_visible()
    start = cut["content"]
    page.wait_for_function("""([sel, n]) => {  // the reply going on: no stats line yet
        const bot = document.querySelector(sel);
        return bot && !bot.querySelector('.reame-stats') && bot.innerText.length > n + 150;
    }""", arg=[BOT, len(start)], timeout=REPLY_TIMEOUT)
    page.locator(BOX).press("Escape")
    wait_for_reply_done(page, 1)
    grown = [t for t in page.evaluate("window.__grown") if t]
    assert grown and all(words(t)[:len(words(start))] == words(start) for t in grown), grown

    reply = client.predict(chat_id, api_name="/get_chat")["messages"][1]
    assert reply["stopped"] and reply["content"].startswith(start), reply
    assert len(reply["content"]) > len(start) + 150
    stats = reply["stats"]
    assert stats["prefilled"] < 20 and stats["reused"] >= stats["prompt_tokens"] - 1, stats
    said = page.locator(STATS_WORDS)
    expect(said).to_contain_text("Went on in ")
    expect(said).to_contain_text("You stopped it.")
    expect(continue_button).to_have_count(0)  # not cut at the limit: stopped
    assert words(without_stats(page.locator(BOT).inner_text())) == words(reply["content"])
    print(f"\nContinue: {stats['prefilled']} token(s) evaluated, {stats['reused']:,} reused "
          f"of a {stats['prompt_tokens']:,}-token prompt")


def test_custom_instructions_make_a_users_new_chats_start_from_one_shared_opening(page, server):
    """Issue 51: "How to answer" and "About me" in the Custom instructions panel go into every
    new chat's system prompt (a chat already shown keeps its own), and their KV is read once: a
    second new chat's first turn evaluates only its message, as its figures say ("prefilled
    N") and its words ("Started from N tokens read before for another chat")."""
    how = ("Answer in two short sentences at most. Use metric units. Say plainly when you are "
           "not sure, and never invent a source, a quotation or a number you do not know.")
    about = ("I coordinate volunteers at a harbour co-op in Lisbon: we repair small fishing "
             "boats, run a tool library and teach knots to children on Saturday mornings.")
    open_app(page, server)
    try:
        open_panel_and_type(page, "#instructions", "#how-to-answer textarea", how)
        page.locator("#about-me textarea").fill(about)
        page.click("#save-instructions")
        expect(page.locator("#instructions-note")).to_contain_text("Saved.")
        evaluated, history = [], []
        for question in ("What knot holds a boat to a ring?", "And for a rope to a post?"):
            new_chat(page)
            send(page, question)
            chat = api(server).predict(current_id(page), api_name="/get_chat")
            stats = chat["messages"][-1]["stats"]
            # Evaluated for this turn: while the message was typed, and after Enter.
            evaluated.append(stats["typed_ahead"] + stats["prefilled"])
            history.append(stats["reused"] - stats["typed_ahead"])
            assert f"prefilled {stats['prefilled']:,} " in stats_figures(page)
        assert how in chat["system_prompt"] and about in chat["system_prompt"]
        # The second chat's prompt is the opening (over a hundred tokens) and its message:
        # it evaluated the message and the template's words around it, nothing more.
        assert stats["prompt_tokens"] > 100 and evaluated[1] <= 24, (evaluated, stats)
        assert history[1] >= stats["prompt_tokens"] - 24, (history, stats)
        words_said = page.locator(STATS_WORDS).last.inner_text()
        assert re.match(rf"Started from (the chat's opening, )?{history[1]:,} tokens",
                        words_said), words_said
        # Kept across a reload; cleared, new chats start with the default system prompt.
        reload(page)
        expect(page.locator("#how-to-answer textarea")).to_have_value(how)
    finally:  # the page tests share this server: its new chats must not keep them
        api(server).predict("", "", api_name="/set_instructions")
    new_chat(page)
    send(page, CAPITAL)
    prompt = api(server).predict(current_id(page), api_name="/get_chat")["system_prompt"]
    assert how not in prompt and about not in prompt
