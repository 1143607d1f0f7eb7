"""The chat list in a real browser: each chat shows its own messages, choosing another stops a
reply that streams, rename, delete; and with accounts, a login and only your own chats.

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; the accounts test starts its own).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from reame.chat import title_from

from .browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT, BOX, CAPITAL, CHATS, ERROR_BADGE, REPLY_TIMEOUT, STATS, TOAST, UI_TIMEOUT, USER,
    VIEWPORT, api, browser, current_chat, new_chat, open_app, open_panel_and_type, page,
    selected_title, send, server, wait_for_reply_done, without_stats, words)
from .conftest import Server, write_config


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
