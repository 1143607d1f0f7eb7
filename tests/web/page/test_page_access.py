"""The page for everyone: no serious accessibility fault (axe-core), the keyboard alone, and a
phone (390x844, touch). Also writes docs/screenshots/phone.png.

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py).
"""

from __future__ import annotations

import re

from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    BUSY,
    CHATS,
    CURRENT,
    EDIT,
    EDIT_BOX,
    EDIT_SUBMIT,
    PLANET,
    REPLY_TIMEOUT,
    RETRY,
    SCREENSHOTS,
    STATS,
    STOP,
    UI_TIMEOUT,
    USER,
    VERSIONS,
    api,
    browser,
    current_id,
    new_chat,
    open_app,
    open_panel_and_type,
    page,
    selected_title,
    send,
    server,
    wait_for_reply_done,
)

PHONE = {"width": 390, "height": 844}
OPEN = re.compile(r"\bopen\b")  # the sidebar's class while it is open
SERIOUS = ("serious", "critical")


def serious_violations(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is, one line each."""
    results = Axe().run(page)
    return [f"{v['id']} ({v['impact']}): {v['help']} — "
            + "; ".join(" ".join(node["target"]) for node in v["nodes"][:5])
            for v in results.response["violations"] if v["impact"] in SERIOUS]


def test_no_serious_accessibility_fault_with_versions_a_search_and_a_menu(page, server):
    open_app(page, server)
    new_chat(page)
    send(page, "What is the capital city of Peru? Answer in one word.")
    page.locator(RETRY).click()
    expect(page.locator(VERSIONS)).to_have_text(["2/2"], timeout=REPLY_TIMEOUT)
    wait_for_reply_done(page, 1)
    assert serious_violations(page) == []
    page.locator(f"{CURRENT} ~ details summary").click()  # the chat's menu, open
    assert serious_violations(page) == []
    page.locator("#chat-search input, #chat-search textarea").press_sequentially("capital")
    expect(page.locator("#chat-list nav")).to_have_attribute("aria-label", "Search results")
    assert serious_violations(page) == []


def test_every_control_has_a_name_and_the_keyboard_reaches_the_message_box(page, server):
    open_app(page, server)
    for _ in range(3):
        new_chat(page)
        send(page, PLANET)
    # Whatever the number of chats, the list is one Tab stop.
    assert page.locator(f'{CHATS}[tabindex="0"]').count() == 1
    names = page.evaluate("""() => [...document.querySelectorAll(
        'button, [role=button], a[href], input, textarea, summary')]
        .filter((e) => e.checkVisibility())
        .filter((e) => !(e.getAttribute('aria-label') || e.title || e.textContent.trim()
                         || e.labels?.length || e.placeholder))
        .map((e) => e.outerHTML.slice(0, 120))""")
    assert names == [], "controls without an accessible name"
    # From the message box, Shift+Tab goes back through the page to the chat list; the
    # arrow keys move in it; Enter opens a chat and typing goes on in the message box.
    page.locator(CURRENT).focus()
    page.keyboard.press("ArrowDown")
    focused_title = page.evaluate("document.activeElement.title")
    page.keyboard.press("Enter")
    expect(page.locator(f"{CURRENT}")).to_have_attribute("title", focused_title)
    expect(page.locator(BOX)).to_be_focused()
    # A reply of the page server's whole 64 tokens: Esc comes while it is written (a short
    # one, "Say hi.", could end first on a loaded machine, and then nothing was stopped).
    page.keyboard.type("Write the numbers from 1 to 500, separated by commas.")
    page.keyboard.press("Enter")
    expect(page.locator(BOT).nth(1)).to_contain_text(re.compile(r"\w"), timeout=REPLY_TIMEOUT)
    page.keyboard.press("Escape")
    wait_for_reply_done(page, 2)
    expect(page.locator(STATS).last).to_contain_text("stopped")
    expect(page.locator(BOX)).to_be_focused()


def test_retry_and_edit_can_be_stopped_with_esc(page, server):
    open_app(page, server)
    new_chat(page)
    send(page, "Write a short story about a fox.")
    # Esc once the retry's reply is being written: it stops there, kept as a new version.
    page.locator(RETRY).click()
    expect(page.locator(BUSY)).to_have_text("Writing…", timeout=REPLY_TIMEOUT)
    page.keyboard.press("Escape")
    wait_for_reply_done(page, 1)
    expect(page.locator(STATS).last).to_contain_text("stopped")
    stored = current_id(page)
    messages = api(server).predict(stored, api_name="/get_chat")["messages"]
    assert messages[-1]["stopped"] is True and messages[-1]["version"] == 2
    expect(page.locator(BOX)).to_be_focused()
    # Esc at once, while the server may still be reading the chat before the reply starts
    # (a loaded machine let such a retry run to its end): the retry is stopped or not made.
    page.locator(RETRY).click()
    expect(page.locator(STOP)).to_be_visible()
    page.keyboard.press("Escape")
    wait_for_reply_done(page, 1)
    messages = api(server).predict(stored, api_name="/get_chat")["messages"]
    assert messages[-1]["stopped"] is True and messages[-1]["version"] in (2, 3), messages[-1]
    # And an edit, Esc once its reply is being written: the edited message stays, with its
    # reply as far as it got.
    edited = "Write a short story about a cat."
    page.locator(EDIT).first.click()
    page.locator(EDIT_BOX).fill(edited)
    page.locator(EDIT_SUBMIT).click()
    expect(page.locator(BUSY)).to_have_text("Writing…", timeout=REPLY_TIMEOUT)
    page.keyboard.press("Escape")
    wait_for_reply_done(page, 1)
    expect(page.locator(STATS).last).to_contain_text("stopped")
    messages = api(server).predict(stored, api_name="/get_chat")["messages"]
    assert [m["content"] for m in messages[:1]] == [edited]
    assert messages[-1]["stopped"] is True
    expect(page.locator(BOX)).to_be_focused()


def test_a_phone_can_do_everything_by_touch(browser, server):
    context = browser.new_context(viewport=PHONE, has_touch=True, is_mobile=True,
                                  device_scale_factor=2)
    context.set_default_timeout(UI_TIMEOUT)
    page = context.new_page()
    try:
        open_app(page, server)
        sidebar = page.locator(".sidebar")
        toggle = page.locator(".sidebar .toggle-button")
        # The chat first: the sidebar starts closed, its button finger-sized and on screen.
        expect(sidebar).not_to_have_class(OPEN)
        expect(page.locator(BOX)).to_be_visible()
        box = toggle.bounding_box()
        assert box["width"] >= 44 and box["height"] >= 44, box
        assert 0 <= box["x"] and box["x"] + box["width"] <= PHONE["width"], box

        # New chat from the sidebar: it closes, the chat is there to type in.
        toggle.tap()
        expect(sidebar).to_have_class(OPEN)
        page.locator("#new-chat").tap()
        expect(sidebar).not_to_have_class(OPEN)
        # A reply long enough to be stopped by a tap on a fast machine too (in a fresh clone's
        # run the server's 64 tokens were written before the tap found the Stop button).
        open_panel_and_type(page, "#chat-settings", "#max-tokens input", "1500")
        page.locator("#chat-settings .reame-panel-toggle").tap()
        expect(page.locator("#max-tokens input")).to_be_hidden()
        page.locator(BOX).tap()
        page.locator(BOX).fill("Write a long story about a ship.")
        page.locator("#message [data-testid=submit-button]").tap()
        expect(page.locator(BOT)).to_contain_text(re.compile(r"\w"), timeout=REPLY_TIMEOUT)
        page.locator(STOP).tap()
        wait_for_reply_done(page, 1)
        first = selected_title(page)
        # The next reply back within the server's 64 tokens: it is read whole, and under the
        # 1500 above a model that rambles (another CPU's rounding) wrote for a minute or more.
        open_panel_and_type(page, "#chat-settings", "#max-tokens input", "64")
        page.locator("#chat-settings .reame-panel-toggle").tap()
        expect(page.locator("#max-tokens input")).to_be_hidden()
        send(page, "Name a famous ship.")
        page.screenshot(path=SCREENSHOTS / "phone.png")

        # Search and switch: the sidebar closes on the chat picked.
        toggle.tap()
        page.locator("#chat-search input, #chat-search textarea").press_sequentially("ship")
        expect(page.locator(CHATS).filter(has_text=first)).to_have_count(1)
        page.locator(CHATS).filter(has_text=first).tap()
        expect(sidebar).not_to_have_class(OPEN)
        expect(page.locator(USER).first).to_have_text("Write a long story about a ship.")
    finally:
        context.close()


def test_tab_from_the_message_box_goes_round_the_page_never_to_the_footer_links(page, server):
    """Gradio's footer links ("Use via API", "Built with Gradio") are no Tab stops; the
    mouse still reaches them."""
    open_app(page, server)
    page.locator(BOX).focus()
    stops = []
    for _ in range(40):
        page.keyboard.press("Tab")
        stops.append(page.evaluate("""() => {
            const e = document.activeElement;
            return [e.closest('footer') !== null, e.outerHTML.slice(0, 100)];
        }"""))
        if page.evaluate("() => !!document.activeElement.closest('#sidebar')"):
            break  # round the page, back at the top
    assert [html for in_footer, html in stops if in_footer] == []
    assert page.evaluate("() => !!document.activeElement.closest('#sidebar')"), stops
    for name in ("Use via API", "Built with Gradio"):
        link = page.locator("footer").get_by_text(name)
        expect(link).to_be_visible()
        link.click(trial=True)  # nothing over it: a click would reach it


def test_ctrl_slash_and_a_question_mark_list_every_shortcut(page, server):
    """Ctrl+/ anywhere, or ? outside a text field, opens the list of the page's shortcuts (a
    modal dialog, no serious accessibility fault); Esc closes it and the focus goes back. A ?
    typed in the message box is a question mark."""
    open_app(page, server)
    box = page.locator(BOX)
    box.click()
    box.press("Control+/")
    help_ = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(help_).to_be_visible()
    for keys in ("Enter", "Shift+Enter", "Esc", "Ctrl+Shift+O", "Ctrl+K", "Ctrl+/"):
        expect(help_.locator("kbd", has_text=re.compile(rf"^{re.escape(keys)}$"))).to_have_count(1)
    assert serious_violations(page) == []
    page.keyboard.press("Escape")
    expect(help_).to_be_hidden()
    expect(box).to_be_focused()
    box.press_sequentially("Why?")
    expect(box).to_have_value("Why?")
    expect(help_).to_be_hidden()
    page.locator("#chatbot").click()  # the focus out of every text field
    page.keyboard.press("?")
    expect(help_).to_be_visible()
    help_.get_by_role("button", name="Close").click()
    expect(help_).to_be_hidden()
