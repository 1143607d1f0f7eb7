"""The page with accounts on, in Chromium: a chat's address (?chat=ID) opens it for its owner
only, and anyone else gets the page with the same note whether the chat is someone else's or
no chat at all; the sidebar whole (a row's ⋯ menu never cut off by the list's scroll box,
Log out in view) in a 1280x900 window and on a phone (390x844).

Helpers and fixtures: tests/browser_helpers.py. The tests share one server of their own.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser_helpers import (  # noqa: F401 - browser is a fixture
    CHATS,
    CURRENT,
    UI_TIMEOUT,
    USER,
    address,
    browser,
    chat_document,
    import_chat,
    open_app,
    page_load,
    selected_title,
    shown_as_loaded,
)
from tests.conftest import Server, start_server
from tests.gradio_api import ApiClient
from tests.web.page.test_page_access import PHONE

PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-22", "dora": "dora-secret-4",
             "emil": "emil-secret-55"}
NOT_HERE = "That chat is not here."
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    """Accounts on: alice (admin), bob, dora and emil."""
    server = start_server(tmp_path_factory.mktemp("accounts-page"), model_path=model_path,
                          max_tokens=8, users=PASSWORDS, admins=("alice",))
    yield server
    server.stop()


@pytest.fixture
def log_in(browser, server):
    """log_in(name, viewport=DESKTOP, **context options): a page of its own, logged in as
    name, showing the page."""
    contexts, errors = [], []

    def open_as(name: str, viewport: dict = DESKTOP, **options) -> Page:
        context = browser.new_context(viewport=viewport, **options)
        contexts.append(context)
        context.set_default_timeout(UI_TIMEOUT)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url)
        page.fill("#username", name)
        page.fill("#password", PASSWORDS[name])
        with page.expect_response(page_load) as loaded:
            page.click("button[type=submit]")
        shown_as_loaded(page, loaded.value)
        return page

    yield open_as
    for context in contexts:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def client_of(server: Server, name: str) -> ApiClient:
    return ApiClient(server.url, auth=(name, PASSWORDS[name]), verbose=False)


def test_a_chat_s_address_opens_it_for_its_owner_and_for_no_one_else(log_in, server):
    alice_chat = import_chat(client_of(server, "alice"), "Alice's secret plans",
                             ["My secret plan is tea at noon.", "A fine plan."])
    bob_chat = import_chat(client_of(server, "bob"), "Bob's notes", ["Buy milk.", "Noted."])

    alice = log_in("alice")
    open_app(alice, server, f"?chat={alice_chat}")
    expect(alice.locator(USER)).to_have_text(["My secret plan is tea at noon."])
    expect(alice.locator("#chat-note")).to_be_hidden()

    # Bob, at alice's chat's address, at one no chat has, and at one that is no id: the page
    # as he would see it anyway (his latest chat, named in the address), with the same note;
    # the server's answers the same to the byte.
    bob = log_in("bob")
    answers = {}
    for asked in (str(alice_chat), str(alice_chat + 1000), "x'1"):
        answers[asked] = open_app(bob, server, f"?chat={asked}")["data"]
        expect(bob.locator("#chat-note")).to_have_text(NOT_HERE)
        expect(bob.locator(USER)).to_have_text(["Buy milk."])
        assert selected_title(bob) == "Bob's notes"
        assert address(bob) == {"chat": str(bob_chat)}
        expect(bob.locator("body")).not_to_contain_text("secret")
    assert answers[str(alice_chat)] == answers[str(alice_chat + 1000)] == answers["x'1"]
    # The note goes once another chat is shown.
    bob.click("#new-chat")
    expect(bob.locator(f"{CURRENT} .reame-title")).to_have_text("New chat")
    expect(bob.locator("#chat-note")).to_be_hidden()


def visible_whole(page: Page, locator) -> bool:
    """Whether the element is inside the window and the topmost thing at its centre (not
    clipped by a scroll box, not covered)."""
    return locator.evaluate("""(e) => {
        const r = e.getBoundingClientRect();
        const inside = r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight
                       && r.right <= innerWidth && r.width > 0 && r.height > 0;
        const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return inside && (top === e || e.contains(top));
    }""")


def menu_item(page: Page, row: int, item: str):
    """Open the ⋯ menu of the row-th chat of the list (scrolled into view); its item."""
    row = page.locator("#chat-list .reame-row").nth(row)
    row.locator("summary").click()
    return row.get_by_role("button", name=item, exact=True)


def test_a_row_s_menu_shows_whole_and_log_out_stays_in_view(log_in, server):
    client = client_of(server, "dora")
    for n in range(3):
        import_chat(client, f"Dora's chat {n}", [f"Question {n}", f"Answer {n}"])
    dora = log_in("dora")
    # The third row's Delete, the list three rows tall: whole, and it asks.
    delete = menu_item(dora, 2, "Delete")
    assert visible_whole(dora, delete)
    questions = []
    dora.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    delete.click()
    assert questions == ["Delete “Dora's chat 0” and all its messages? This cannot be undone."]

    # Many chats: the list takes the height left, Log out is in view, every menu whole.
    many = {"format": "reame-chats", "version": 1, "exported_at": 0,
            "chats": [chat_document(f"Dora's chat {n}", [f"Question {n}", f"Answer {n}"])
                      for n in range(3, 40)]}
    client.predict(json.dumps(many), api_name="/import_chats")
    dora.reload()
    expect(dora.locator(CHATS)).to_have_count(40)
    log_out = dora.get_by_role("link", name="Log out")
    expect(log_out).to_be_in_viewport(ratio=1)
    assert visible_whole(dora, log_out)
    assert dora.evaluate("""() => {
        const box = document.querySelector('#sidebar .sidebar-content');
        return box.scrollHeight <= box.clientHeight;
    }"""), "the sidebar itself does not scroll: only the list does"
    for row in (2, 12, 39):  # near the top, the last row in view, the list's last row
        dora.locator("#chat-list .reame-row").nth(row).scroll_into_view_if_needed()
        for item in ("Pin", "Delete"):
            shown = menu_item(dora, row, item)
            assert visible_whole(dora, shown), (row, item)
            dora.locator("#chat-list .reame-row").nth(row).locator("summary").click()  # closed
            expect(shown).to_be_hidden()
    # The menu's actions work from where it shows: Pin on the list's last row.
    menu_item(dora, 39, "Pin").click()
    expect(dora.locator("#chat-list .reame-group").first).to_have_text("Pinned")

    # On a phone, with the sidebar open.
    phone = log_in("dora", PHONE, has_touch=True, is_mobile=True, device_scale_factor=2)
    phone.locator(".sidebar .toggle-button").tap()
    expect(phone.locator(".sidebar")).to_have_class(re.compile(r"\bopen\b"))
    log_out = phone.get_by_role("link", name="Log out")
    expect(log_out).to_be_in_viewport(ratio=1)
    assert visible_whole(phone, log_out)
    row = phone.locator("#chat-list .reame-row").nth(3)
    row.locator("summary").tap()
    assert visible_whole(phone, row.get_by_role("button", name="Delete"))
