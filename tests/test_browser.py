"""The web page in a real browser: Debian's Chromium driven by Playwright, against real server
processes (`python app.py`) with the real model. Also writes docs/screenshots/*.png.

Most tests share one module-scoped server (each works in chats of its own); the missing-model
test starts its own. Every wait is on a condition; the model's replies get generous timeouts
because the 2-core machine may be busy with other work.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import pytest
from gradio_client import Client
from playwright.sync_api import Browser, Page, expect, sync_playwright

from reame.batches import CHUNK
from reame.chat import title_from
from reame.render import stats_text
from reame.turn import TurnStats

from .conftest import ROOT, Server, write_config

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-gpu"]
SCREENSHOTS = ROOT / "docs" / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}

REPLY_TIMEOUT = 90_000  # ms: a whole reply of up to 64 tokens on a busy machine
UI_TIMEOUT = 15_000  # ms: a quick UI event
expect.set_options(timeout=UI_TIMEOUT)

BOX = "#message textarea"
USER = "#chatbot [data-testid=user]"
BOT = "#chatbot [data-testid=bot]"
STATS = "#chatbot .reame-stats"
STOP = "#message [data-testid=stop-button]"
SUBMIT = "#message [data-testid=submit-button]"
TOAST = ".toast-body"
# Gradio's "Error" pill over an output (it stays in the page, hidden, once used).
ERROR_BADGE = "[data-testid=status-tracker]:not(.hide) .error"
CHATS = "#chat-list label"
# The Chatbot's buttons (its own aria-labels): retry under the last reply, edit on each message
# of the user, and the edit box with its submit button.
RETRY = "#chatbot button[aria-label=Retry]"
EDIT = "#chatbot button[aria-label=Edit]"
EDIT_BOX = "#chatbot textarea.edit-textarea"
EDIT_SUBMIT = "#chatbot button[aria-label=Submit]"

CAPITAL = "What is the capital city of France? Answer in one word."
PLANET = "Which planet do we live on? Answer in one word."
ITALY = "What is the capital of Italy?"
STATS_TAIL = re.compile(r"(\d+) tokens at [\d.]+ tok/s")
# The head of a stats line when the history's KV was reused, from the context or from a file.
REUSED = re.compile(r"^(?:reused ([\d,]+) tokens in memory|restored ([\d,]+) tokens from disk "
                    r"in [\d,]+ ms) · prefilled ([\d,]+) in ")


# fixtures


@pytest.fixture(scope="module")
def browser() -> Browser:
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: run `make browser` to install it")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser) -> Page:
    """A fresh page (its own context: no cookies, storage or Gradio session shared)."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(UI_TIMEOUT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def start_server(folder: Path, **config) -> Server:
    folder.mkdir(parents=True, exist_ok=True)
    return Server(write_config(folder, **config), folder / "server.log").start()


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    """One server for the tests whose chats don't interfere; replies of at most 64 tokens."""
    server = start_server(tmp_path_factory.mktemp("browser"), model_path=model_path,
                          max_tokens=64)
    yield server
    server.stop()


# helpers


def api(server: Server) -> Client:
    return Client(server.url, verbose=False)


def open_app(page: Page, server: Server) -> None:
    """Open the page and wait for its load event (the chat list and the chat shown)."""
    with page.expect_response(lambda r: r.url.endswith("/gradio_api/run/predict")) as loaded:
        page.goto(server.url)
    shown_as_loaded(page, loaded.value)


def reload(page: Page) -> None:
    with page.expect_response(lambda r: r.url.endswith("/gradio_api/run/predict")) as loaded:
        page.reload()
    shown_as_loaded(page, loaded.value)


def shown_as_loaded(page: Page, load) -> None:
    """Wait until the page shows what its load event answered: every chat in the list."""
    assert load.ok, load.status
    chat_list = load.json()["data"][1]  # the outputs' order: see reame/web/page.py, `view`
    expect(page.locator(CHATS)).to_have_count(len(chat_list["choices"]))
    expect(page.locator(BOX)).to_be_editable()


def new_chat(page: Page) -> None:
    """Click "New chat" and wait until it is the chat shown: selected, empty."""
    before = page.locator(CHATS).count()
    page.click("#new-chat")
    expect(page.locator(CHATS)).to_have_count(before + 1)
    expect(page.locator("#chat-list input:checked")).to_have_count(1)
    assert selected_title(page) == "New chat"
    expect(page.locator(USER)).to_have_count(0)


def open_panel_and_type(page: Page, panel: str, field: str, value: str) -> None:
    """Open a closed panel of the page and type into one of its fields in the first frame the
    field shows: as quick as a user could ever be (the page must not lose that value)."""
    page.evaluate("""([panel, field, value]) => new Promise(resolve => {
        document.querySelector(`${panel} .reame-panel-toggle`).click();
        const typeIn = () => {
            const input = document.querySelector(field);
            if (!input || !input.checkVisibility()) return requestAnimationFrame(typeIn);
            input.focus();
            input.value = value;
            input.dispatchEvent(new Event("input", {bubbles: true}));
            resolve();
        };
        typeIn();
    })""", [panel, field, value])


def selected_title(page: Page) -> str:
    return page.locator(CHATS).filter(has=page.locator("input:checked")).inner_text().strip()


def wait_for_reply_done(page: Page, n_replies: int) -> None:
    """The n-th reply of the chat shown has its stats line, and the textbox is ready again."""
    expect(page.locator(STATS)).to_have_count(n_replies, timeout=REPLY_TIMEOUT)
    expect(page.locator(STOP)).to_have_count(0)
    expect(page.locator(SUBMIT)).to_be_visible()


def send(page: Page, text: str) -> str:
    """Send text with Enter and wait for the whole reply; return the reply's text as shown."""
    replies = page.locator(STATS).count()
    box = page.locator(BOX)
    box.fill(text)
    box.press("Enter")
    wait_for_reply_done(page, replies + 1)
    return page.locator(BOT).last.inner_text()


def typed_ahead_call(response, text: str) -> bool:
    """Whether response answers the page's type-ahead call made with all of text typed (the
    page calls as the box changes, always with the latest text once a call is answered)."""
    if "/run/predict" not in response.url:
        return False
    try:
        data = json.loads(response.request.post_data or "{}").get("data") or []
    except ValueError:
        return False
    return text in data


def without_stats(shown: str) -> str:
    return shown.rsplit("\n", 1)[0].strip() if STATS_TAIL.search(shown) else shown.strip()


def current_chat(server: Server, title: str) -> dict:
    """The chat with this title, with its messages, as the server has it."""
    client = api(server)
    matches = [c for c in client.predict(api_name="/list_chats") if c["title"] == title]
    assert len(matches) == 1, f"expected one chat titled {title!r}, got {matches}"
    return client.predict(matches[0]["id"], api_name="/get_chat")


def stored_stats_text(stats: dict) -> str:
    """The stats line the page shows for a reply's stored stats."""
    return stats_text(TurnStats.from_dict(stats))


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def wait_until(condition, message: str, timeout: float = UI_TIMEOUT / 1000) -> None:
    """Poll a server-side condition (the page has no event for it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message)
        time.sleep(0.1)


# tests


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
    assert shown.endswith(stats) and STATS_TAIL.search(stats), (shown, stats)
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
    chat_id = client.predict(api_name="/list_chats")[0]["id"]
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
    # Sending again while the reply streams is refused, and the typed text stays in the box.
    box.fill(CAPITAL)
    box.press("Enter")
    expect(page.locator(TOAST).filter(has_text="A reply is still being written")).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(page.locator(USER)).to_have_count(1)
    expect(page.locator(STATS)).to_have_count(0)
    page.click(STOP)

    # The partial reply stays, now with its stats line saying it was stopped.
    wait_for_reply_done(page, 1)
    stats = page.locator(STATS).inner_text()
    assert "stopped" in stats, stats
    partial = without_stats(bot.inner_text())
    assert partial, "the partial reply disappeared"
    expect(box).to_have_value(CAPITAL)

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


def test_each_chat_in_the_sidebar_shows_its_own_messages(page, server):
    open_app(page, server)
    first = "What is the capital city of Italy? Answer in one word."
    second = "What is the capital city of Japan? Answer in one word."
    new_chat(page)
    send(page, first)
    new_chat(page)
    send(page, second)
    expect(page.locator(CHATS).filter(has_text=title_from(first))).to_have_count(1)

    for shown, other in [(first, second), (second, first), (first, second)]:
        page.locator(CHATS).filter(has_text=title_from(shown)).click()
        expect(page.locator(USER)).to_have_text([shown])
        expect(page.locator(BOT)).to_have_count(1)
        assert selected_title(page) == title_from(shown)
        stored = current_chat(server, title_from(shown))["messages"]
        assert words(without_stats(page.locator(BOT).inner_text())) == words(stored[1]["content"])
        expect(page.locator("#chatbot")).not_to_contain_text(other)


def test_choosing_another_chat_while_a_reply_streams_stops_it(page, server):
    client = api(server)
    quiet = client.predict("A quiet chat", None, api_name="/new_chat")
    open_app(page, server)
    new_chat(page)
    box = page.locator(BOX)

    for turn, (prompt, leave) in enumerate([("Write a short story about a dog.", "sidebar"),
                                            ("Write a short story about a bird.", "new chat")]):
        box.fill(prompt)
        box.press("Enter")
        expect(page.locator(BOT)).to_have_count(turn + 1, timeout=REPLY_TIMEOUT)
        expect(page.locator(BOT).nth(turn)).not_to_have_text("", timeout=REPLY_TIMEOUT)
        if leave == "sidebar":
            page.locator(CHATS).filter(has_text="A quiet chat").click()
            shown = "A quiet chat"
        else:
            page.click("#new-chat")
            shown = "New chat"
        # The chosen chat is shown, and stays shown once the stopped stream has ended.
        expect(page.locator(USER)).to_have_count(0)
        wait_for_reply_done(page, 0)
        expect(page.locator(USER)).to_have_count(0)
        expect(page.locator(BOT)).to_have_count(0)
        assert selected_title(page) == shown
        # The stopped reply was saved in its own chat.
        stored = current_chat(server, title_from("Write a short story about a dog."))["messages"]
        assert stored[-1]["role"] == "assistant" and stored[-1]["content"]
        if leave == "sidebar":
            page.locator(CHATS).filter(has_text="Write a short story about a dog.").click()
            expect(page.locator(USER)).to_have_text([prompt])
            expect(page.locator(STATS)).to_have_count(1)
    assert client.predict(quiet, api_name="/get_chat")["messages"] == []


def test_rename_shows_the_new_title_in_the_sidebar(page, server):
    client = api(server)
    chat_id = client.predict("Before the rename", None, api_name="/new_chat")
    open_app(page, server)
    assert selected_title(page) == "Before the rename", "the newest chat is shown first"

    title_box = page.locator("#rename-box input, #rename-box textarea")
    open_panel_and_type(page, "#manage", "#rename-box input, #rename-box textarea",
                        "Renamed in the browser")
    page.click("#rename-btn")
    expect(page.locator(CHATS).filter(has_text="Renamed in the browser")).to_have_count(1)
    expect(page.locator(CHATS).filter(has_text="Before the rename")).to_have_count(0)
    assert selected_title(page) == "Renamed in the browser"
    expect(title_box).to_have_value("")
    assert client.predict(chat_id, api_name="/get_chat")["title"] == "Renamed in the browser"

    # An empty title is refused with a message; the sidebar stays usable (no "Error" badge).
    title_box.fill("   ")
    title_box.press("Enter")
    expect(page.locator(TOAST).filter(has_text="a chat title cannot be empty")).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    assert selected_title(page) == "Renamed in the browser"
    assert client.predict(chat_id, api_name="/get_chat")["title"] == "Renamed in the browser"


def test_delete_asks_first_and_removes_the_chat(page, server):
    client = api(server)
    chat_id = client.predict("Chat to delete", None, api_name="/new_chat")
    open_app(page, server)
    assert selected_title(page) == "Chat to delete"
    page.click("#manage .reame-panel-toggle")
    confirm = page.locator("#confirm-delete")

    page.click("#delete-btn")
    expect(confirm).to_be_visible()
    expect(page.locator("#confirm-text")).to_contain_text("Delete this chat")
    page.click("#cancel-delete")
    expect(confirm).to_be_hidden()
    expect(page.locator(CHATS).filter(has_text="Chat to delete")).to_have_count(1)
    assert chat_id in [c["id"] for c in client.predict(api_name="/list_chats")]

    page.click("#delete-btn")
    confirm.click()
    expect(page.locator(CHATS).filter(has_text="Chat to delete")).to_have_count(0)
    expect(confirm).to_be_hidden()
    assert chat_id not in [c["id"] for c in client.predict(api_name="/list_chats")]
    with pytest.raises(Exception, match="does not exist"):
        client.predict(chat_id, api_name="/get_chat")
    # Another chat (the newest left) is shown and selected.
    listed = client.predict(api_name="/list_chats")
    assert selected_title(page) == listed[0]["title"]


def test_a_chat_survives_a_reload_and_a_server_restart(page, server):
    open_app(page, server)
    new_chat(page)
    first = send(page, CAPITAL)
    assert "Paris" in first
    second = send(page, "Name three primary colors.")
    expected_users = [CAPITAL, "Name three primary colors."]
    expected_bots = [first, second]

    def check_shown():
        assert selected_title(page) == title_from(CAPITAL)
        expect(page.locator(USER)).to_have_text(expected_users)
        expect(page.locator(BOT)).to_have_text(expected_bots)
        expect(page.locator(STATS)).to_have_count(2)

    reload(page)
    check_shown()
    server.restart()
    reload(page)
    check_shown()
    stored = current_chat(server, title_from(CAPITAL))["messages"]
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
    line = page.locator(STATS).last.inner_text()
    typed = re.match(r"restored [\d,]+ tokens from disk in \d+ ms · (\d+) evaluated while typing "
                     r"· prefilled (\d+) ", line)
    assert typed, line
    assert int(typed[1]) >= 4 and int(typed[2]) <= 8, line
    assert "Rome" in page.locator(BOT).last.inner_text()
    expect(page.locator("#cache-stats")).to_contain_text("1 of 1 lookups")

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "chat.png", full_page=True)


def test_retry_replaces_the_last_reply_and_reuses_the_history(page, server):
    open_app(page, server)
    new_chat(page)
    assert "Paris" in send(page, CAPITAL)
    assert "Earth" in send(page, PLANET)
    client = api(server)
    chat_id = client.predict(api_name="/list_chats")[0]["id"]  # the chat shown: the latest
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
                and last["stats"])

    wait_until(replaced, "the retried reply was not stored", timeout=REPLY_TIMEOUT / 1000)
    after = client.predict(chat_id, api_name="/get_chat")["messages"]
    new_reply = after[-1]
    # The last reply was replaced, not added to: the same two questions, two replies.
    assert [m["id"] for m in after[:-1]] == [m["id"] for m in before[:-1]]
    assert [m["role"] for m in after] == ["user", "assistant", "user", "assistant"]

    # The page shows the new reply with its own stats line, and nothing else changed.
    line = stored_stats_text(new_reply["stats"])
    expect(page.locator(STATS).last).to_have_text(line, timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 2)
    expect(page.locator(USER)).to_have_text([CAPITAL, PLANET])
    expect(page.locator(BOT)).to_have_count(2)
    assert "Earth" in without_stats(page.locator(BOT).last.inner_text())
    assert words(new_reply["content"]) == words(without_stats(page.locator(BOT).last.inner_text()))

    # It reused the whole history (the same prompt as the replaced reply's) instead of
    # recomputing it: only the prompt's last decode (one chunk at most) was evaluated again.
    stats = new_reply["stats"]
    assert stats["prompt_tokens"] == old_reply["stats"]["prompt_tokens"], (stats, old_reply)
    match = REUSED.match(line)
    assert match, line
    reused = int((match[1] or match[2]).replace(",", ""))
    assert reused == stats["reused"] and reused + stats["prefilled"] == stats["prompt_tokens"]
    assert stats["prefilled"] <= CHUNK, stats  # the prompt's last decode, evaluated again

    reload(page)
    expect(page.locator(USER)).to_have_text([CAPITAL, PLANET])
    expect(page.locator(STATS)).to_have_text([stored_stats_text(after[1]["stats"]), line])


def test_editing_an_earlier_message_replaces_what_followed_it(page, server):
    open_app(page, server)
    new_chat(page)
    first = "What is the capital city of Germany? Answer in one word."
    assert "Berlin" in send(page, first)
    hello = send(page, "Say hello.")
    chat_id = api(server).predict(api_name="/list_chats")[0]["id"]  # the chat shown
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
    assert "Earth" in without_stats(reply), reply
    chat_view = page.locator("#chatbot")
    for gone in (first, "Berlin", "Say hello.", without_stats(hello)):
        expect(chat_view).not_to_contain_text(gone)
    line = page.locator(STATS).inner_text()
    assert STATS_TAIL.search(line), line

    stored = api(server).predict(chat_id, api_name="/get_chat")["messages"]
    assert [(m["role"], m["content"]) for m in stored[:1]] == [("user", edited)]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert words(stored[1]["content"]) == words(without_stats(reply))
    assert line == stored_stats_text(stored[1]["stats"])

    # After a reload the page shows the chat as stored: the edited text, the old one gone.
    reload(page)
    page.locator(CHATS).filter(has_text=title_from(first)).click()
    expect(page.locator(USER)).to_have_text([edited])
    expect(page.locator(BOT)).to_have_text([reply])
    for gone in (first, "Berlin", "Say hello."):
        expect(chat_view).not_to_contain_text(gone)


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
    chat_id = api(server).predict(api_name="/list_chats")[0]["id"]
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


def test_a_long_chat_marks_where_the_model_s_memory_ends_and_keeps_every_message(
        page, server_factory, model_path):
    from .test_long_chat import ANSWERS, FILLER, QUESTIONS

    server = server_factory(model_path=model_path, n_ctx=1024, max_tokens=32)
    open_app(page, server)
    new_chat(page)
    marker = page.locator("#chatbot .reame-window")
    sent = []
    while not marker.count():
        assert len(sent) < 12, "the 1,024-token window should overflow within 12 turns"
        n = len(sent)
        sent.append(FILLER + QUESTIONS[n % 2])
        reply = send(page, sent[-1])
        assert ANSWERS[n % 2] in reply, reply
    line = page.locator(STATS).last.inner_text()
    assert "context shifted" in line and "nothing recomputed" in line, line
    expect(marker).to_have_count(1)
    expect(marker).to_have_text("⋯ earlier messages are outside the model's memory ⋯")

    def check_marker_place():
        messages = current_chat(server, selected_title(page))["messages"]
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


def test_with_accounts_the_page_asks_for_a_login_and_shows_only_your_chats(
        browser, tmp_path, model_path):
    from .test_accounts import PASSWORDS, cli

    config = write_config(tmp_path, model_path=model_path, max_tokens=16)
    for name in ("alice", "bob"):
        assert cli(config, "adduser", name, password=PASSWORDS[name]).returncode == 0
    server = Server(config, tmp_path / "server.log").start()
    try:
        pages = {}
        for name in ("alice", "bob"):
            context = browser.new_context(viewport=VIEWPORT)
            context.set_default_timeout(UI_TIMEOUT)
            page = pages[name] = context.new_page()
            page.goto(server.url)
            expect(page.get_by_text("log in with your user name and password")).to_be_visible()
            if name == "alice":  # a wrong password first
                page.get_by_label("username").fill(name)
                page.get_by_label("password").fill("not the password")
                page.get_by_role("button", name="Login").click()
                expect(page.get_by_text("Incorrect Credentials")).to_be_visible()
            page.get_by_label("username").fill(name)
            page.get_by_label("password").fill(PASSWORDS[name])
            page.get_by_role("button", name="Login").click()
            expect(page.locator(BOX)).to_be_editable()
        alice = pages["alice"]
        assert "Paris" in send(alice, CAPITAL)
        expect(alice.locator(CHATS)).to_have_count(1)
        bob = pages["bob"]
        bob.reload()
        expect(bob.locator(BOX)).to_be_editable()
        expect(bob.locator(CHATS)).to_have_count(0)
        expect(bob.locator(USER)).to_have_count(0)
        for page in pages.values():
            page.context.close()
    finally:
        server.stop()
