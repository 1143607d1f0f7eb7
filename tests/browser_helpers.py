"""What the page tests share: Debian's Chromium driven by Playwright, the page's selectors and
prompts, and helpers that act in the page and read what the server stored.

The page's tests: tests/web/page/test_page_send.py (sending, the reply streaming, stop, refusals),
test_page_chats.py (the chat list) and test_page_history.py (a chat kept across reloads and
restarts, retried, edited; the window marker); tests/web/page/test_browser_settings.py is the Settings
tab. The first three share one server (`server` here, `page_server` in tests/conftest.py),
each test working in chats of its own; a test that needs another set-up starts its own. Every
wait is on a condition; the model's replies get generous timeouts because the 2-core machine
may be busy with other work.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from reame.inference.turn import TurnStats
from reame.web.page.render import stats_text

from .conftest import ROOT, Server
from .gradio_api import ApiClient

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-gpu"]
# The README's screenshots are taken by the page tests but written into docs/ only by
# `make screenshots` (REAME_SCREENSHOTS=1): a test run leaves the tracked files alone.
SCREENSHOTS = (ROOT / "docs" / "screenshots" if os.environ.get("REAME_SCREENSHOTS") == "1"
               else Path(tempfile.mkdtemp(prefix="reame-screenshots-")))
VIEWPORT = {"width": 1280, "height": 800}

REPLY_TIMEOUT = 90_000  # ms: a whole reply of up to 64 tokens on a busy machine
UI_TIMEOUT = 15_000  # ms: a quick UI event
expect.set_options(timeout=UI_TIMEOUT)

BOX = "#message textarea"
USER = "#chatbot [data-testid=user]"
BOT = "#chatbot [data-testid=bot]"
STATS = "#chatbot .reame-stats"  # a reply's stats line: its words, the figures under Details
STATS_WORDS = "#chatbot .reame-stats-words"
STATS_DETAILS = "#chatbot .reame-stats-tech"  # hidden until opened: read its text_content()
STOP = "#message [data-testid=stop-button]"
# The page's quiet state while a reply is on its way: "Reading…", then "Writing…" (page.js).
BUSY = "#reame-busy"
SUBMIT = "#message [data-testid=submit-button]"
TOAST = ".toast-body"
# Gradio's "Error" pill over an output (it stays in the page, hidden, once used).
ERROR_BADGE = "[data-testid=status-tracker]:not(.hide) .error"
CHATS = "#chat-list .reame-open"  # one per chat in the sidebar's list
CURRENT = "#chat-list .reame-open[aria-current=page]"
# The Chatbot's buttons (its own aria-labels): retry under the last reply, edit on each message
# of the user, and the edit box with its submit button.
RETRY = "#chatbot button[aria-label=Retry]"
EDIT = "#chatbot button[aria-label=Edit]"
EDIT_BOX = "#chatbot textarea.edit-textarea"
EDIT_SUBMIT = "#chatbot button[aria-label=Submit]"

CAPITAL = "What is the capital city of France? Answer in one word."
PLANET = "Which planet do we live on? Answer in one word."
ITALY = "What is the capital of Italy?"
STATS_TAIL = re.compile(r"(\d+) tokens at [\d.]+ tok/s")  # in the stats line's figures
# The stats line as a message's text shows it (its figures folded under Details).
STATS_SHOWN = re.compile(r"\n[^\n]*\bDetails$")
# The buttons under a message (reame/web/page/render.py, message_tools), as its text shows
# them.
TOOLS_LINE = re.compile(
    r"(?:\s|[‹›]|Previous version|Next version|\d+/\d+|Continue|Branch from here)*$")
VERSIONS = "#chatbot .reame-version-of"
PREVIOUS = "#chatbot .reame-tool[title='Previous version']"
NEXT = "#chatbot .reame-tool[title='Next version']"
BRANCH = "#chatbot .reame-tool[title='Branch from here']"
# The head of a stats line's figures when the history's KV was reused, from the context or
# from a file.
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


@pytest.fixture
def server(page_server) -> Server:
    """The server the page tests share (see `page_server` in tests/conftest.py)."""
    return page_server


# helpers


def api(server: Server) -> ApiClient:
    return ApiClient(server.url, verbose=False)


def page_load(response) -> bool:
    """Whether response answers the page's load event: an unqueued call (Gradio adds the
    page's own query to its address) triggered by the Blocks themselves (component 0). Other
    unqueued events of the page before a reload (its report of a reply's wait, the list's
    timer) are triggered by their own components: a response of the page navigated away from
    has no body to read (seen once in a fresh-clone run of test_page_live)."""
    if not urlsplit(response.url).path.endswith("/gradio_api/run/predict"):
        return False
    try:
        return json.loads(response.request.post_data or "{}").get("trigger_id") == 0
    except ValueError:
        return False


def open_app(page: Page, server: Server, query: str = "") -> dict:
    """Open the page (at its address with query, e.g. "?chat=12") and wait for its load event
    (the chat list and the chat shown); the load's answer."""
    with page.expect_response(page_load) as loaded:
        page.goto(server.url + query)
    shown_as_loaded(page, loaded.value)
    return loaded.value.json()


def address(page: Page) -> dict[str, str]:
    """The query of the page's address, e.g. {"chat": "12"}."""
    return dict(parse_qsl(urlsplit(page.url).query))


def chat_document(title: str, texts: list[str], written: list[float] | None = None) -> dict:
    """A chat of alternate user and assistant messages, in Reame's export format (imported
    by the API's /import_chats or the page's Import): a chat with messages, no model needed.
    written: when each message was written (seconds since 1970)."""
    written = written or [time.time()] * len(texts)
    messages = [{"id": n + 1, "parent": n or None, "role": ("user", "assistant")[n % 2],
                 "content": text, "created_at": at}
                for n, (text, at) in enumerate(zip(texts, written))]
    return {"format": "reame-chat", "version": 1, "title": title, "created_at": written[0],
            "updated_at": written[-1], "settings": {}, "current": len(messages),
            "messages": messages}


def import_chat(client: ApiClient, title: str, texts: list[str],
                written: list[float] | None = None) -> int:
    """A chat made by importing chat_document(...): its id."""
    return client.predict(json.dumps(chat_document(title, texts, written)),
                          api_name="/import_chats")[0]


def reload(page: Page) -> None:
    with page.expect_response(page_load) as loaded:
        page.reload()
    shown_as_loaded(page, loaded.value)


def shown_as_loaded(page: Page, load) -> None:
    """Wait until the page shows what its load event answered: every chat in the list."""
    assert load.ok, load.status
    # the outputs' order: see reame/web/page/layout.py, `view`
    chat_list = load.json()["data"][1]
    if isinstance(chat_list, dict):
        chat_list = chat_list.get("value") or ""
    expect(page.locator(CHATS)).to_have_count(chat_list.count('class="reame-open"'))
    expect(page.locator(BOX)).to_be_editable()


def new_chat(page: Page) -> None:
    """Click "New chat" and wait until it is the chat shown: selected, empty (the newest
    chat, if it was still empty, or a new one)."""
    page.click("#new-chat")
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text("New chat")
    expect(page.locator(USER)).to_have_count(0)
    expect(page.locator(BOX)).to_be_focused()
    # The following of a reply in the chat shown before (a page opened on a chat being
    # written) ends a moment later: until then the box's Stop shows and Enter keeps the
    # message in the box (page.js). Known page issue: Enter within that moment is held.
    expect(page.locator(STOP)).to_be_hidden()


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
    return page.locator(f"{CURRENT} .reame-title").inner_text().strip()


def current_id(page: Page) -> int:
    """The id of the chat the page shows (its row in the list)."""
    return int(page.locator(CURRENT).evaluate("b => b.closest('.reame-row').dataset.chat"))


def chat_menu(page: Page, title: str, item: str) -> None:
    """Open the menu of the chat titled title in the list, and choose item in it."""
    row = page.locator("#chat-list .reame-row").filter(
        has=page.locator(".reame-title", has_text=title))
    row.locator("summary").click()
    row.get_by_role("button", name=item, exact=True).click()


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
    """A message's text as shown, without the lines the page adds: its tools (versions,
    "Branch from here") and its stats line (its words and "Details")."""
    return STATS_SHOWN.sub("", TOOLS_LINE.sub("", shown.strip()).strip()).strip()


def stats_figures(page: Page, n: int = -1) -> str:
    """The figures of the n-th stats line of the chat shown (under its Details)."""
    return page.locator(STATS_DETAILS).nth(n).text_content()


def current_chat(server: Server, page: Page, title: str) -> dict:
    """The chat the page shows, with its messages, as the server has it; it is titled title.
    (By its id, not its title: other tests on the same server may have chats of that title.)"""
    client = api(server)
    chat_id = current_id(page)
    titles = {c["id"]: c["title"] for c in client.predict(api_name="/list_chats")}
    assert titles.get(chat_id) == title, f"the chat shown is {titles.get(chat_id)!r}, not {title!r}"
    return client.predict(chat_id, api_name="/get_chat")


def stored_stats_text(stats: dict) -> str:
    """The figures the page shows under a reply's Details for its stored stats."""
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


# From the keydown of Enter in the message box to the first words of the reply.
FIRST_WORDS_JS = """() => {
    let started = null;
    const box = document.querySelector('#message textarea');
    box.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' && started === null) started = performance.now();
    }, {capture: true, once: true});
    window.__firstWords = new Promise(resolve => {
        const observer = new MutationObserver(() => {
            const bots = document.querySelectorAll('#chatbot [data-testid=bot]');
            const last = bots[bots.length - 1];
            if (started !== null && last && last.innerText.trim()
                    && !last.querySelector('.reame-queued, .reame-reading')) {
                observer.disconnect();
                resolve((performance.now() - started) / 1000);
            }
        });
        observer.observe(document.querySelector('#chatbot'),
                         {subtree: true, childList: true, characterData: true});
    });
}"""


def first_words_after_enter(page: Page, question: str) -> float:
    """Type question, press Enter, and the seconds until the reply's first words show."""
    box = page.locator(BOX)
    box.fill(question)
    page.evaluate(FIRST_WORDS_JS)
    box.press("Enter")
    return page.evaluate("window.__firstWords")
