"""Archiving a chat, in a real browser: it leaves the list, "Archived chats (N)" shows it
marked, search still finds it, and Unarchive brings it back; the named API does the same.

Helpers and fixtures: tests/browser_helpers.py.
"""

from __future__ import annotations

from playwright.sync_api import expect

from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    CHATS,
    api,
    browser,
    chat_menu,
    open_app,
    page,
    server,
)

TITLES = "#chat-list .reame-title"
ARCHIVED_LINK = "#chat-list .reame-archived-link"


def test_an_archived_chat_leaves_the_list_stays_findable_and_comes_back(page, server):
    client = api(server)
    gone = client.predict("Harbour archive plans", None, api_name="/new_chat")
    client.predict("Harbour plans kept", None, api_name="/new_chat")
    open_app(page, server)
    expect(page.locator(TITLES).filter(has_text="Harbour archive plans")).to_have_count(1)

    chat_menu(page, "Harbour archive plans", "Archive")
    expect(page.locator(TITLES).filter(has_text="Harbour archive plans")).to_have_count(0)
    expect(page.locator(TITLES).filter(has_text="Harbour plans kept")).to_have_count(1)
    link = page.locator(ARCHIVED_LINK)
    expect(link).to_have_text("Archived chats (1)")

    # Search still finds it, marked.
    page.fill("#chat-search textarea, #chat-search input", "harbour")
    found = page.locator("#chat-list .reame-row").filter(has_text="Harbour archive plans")
    expect(found).to_have_count(1)
    expect(found.locator(".reame-archived-tag")).to_have_text("Archived")
    page.fill("#chat-search textarea, #chat-search input", "")
    expect(page.locator(TITLES).filter(has_text="Harbour archive plans")).to_have_count(0)

    # The archived chats, and back.
    page.locator(ARCHIVED_LINK).click()
    expect(page.locator("#chat-list nav")).to_have_attribute("aria-label", "Archived chats")
    expect(page.locator(TITLES)).to_have_text(["Harbour archive plans"])
    chat_menu(page, "Harbour archive plans", "Unarchive")
    expect(page.locator(TITLES).filter(has_text="Harbour archive plans")).to_have_count(1)
    expect(page.locator(TITLES).filter(has_text="Harbour plans kept")).to_have_count(1)
    expect(page.locator(ARCHIVED_LINK)).to_have_count(0)
    assert page.locator(CHATS).count() >= 2

    # The named API archives and brings back too.
    assert client.predict(gone, api_name="/archive_chat")["archived"] is True
    assert client.predict(gone, api_name="/archive_chat")["archived"] is False
