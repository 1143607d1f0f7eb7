"""The page with accounts on, in Chromium: a chat's address (?chat=ID) opens it for its owner
only, and anyone else gets the page with the same note whether the chat is someone else's or
no chat at all.

Helpers and fixtures: tests/browser_helpers.py. The tests share one server of their own.
"""

from __future__ import annotations


import pytest
from playwright.sync_api import Page, expect

from reame.accounts.users import Accounts

from .browser_helpers import (  # noqa: F401 - browser is a fixture
    CURRENT,
    UI_TIMEOUT,
    USER,
    address,
    browser,
    import_chat,
    open_app,
    page_load,
    selected_title,
    shown_as_loaded,
)
from .conftest import Server, write_config
from .gradio_api import ApiClient

PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-22", "dora": "dora-secret-4",
             "emil": "emil-secret-55"}
NOT_HERE = "That chat is not here."
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    """Accounts on: alice (admin), bob, dora and emil."""
    folder = tmp_path_factory.mktemp("accounts-page")
    config = write_config(folder, model_path=model_path, max_tokens=8, users_file="users.json")
    accounts = Accounts(folder / "users.json")
    for name, password in PASSWORDS.items():
        accounts.add_user(name, password, admin=name == "alice")
    server = Server(config, folder / "server.log").start()
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

