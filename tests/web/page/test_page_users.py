"""The admin's Users tab and the note about the chats from before accounts (reame/web/
page/users_panel.py), against a real server with accounts, in Chromium: add a user who then sees
only their own chats, reset a password, make and revoke an API key, remove a user, adopt the
old chats; and a non-admin who neither sees the tab nor can call its events past the page.

The tests share one server and run in this file's order: the non-admin's test needs the chats
from before accounts still unadopted, the adopting test adopts them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from reame.accounts.users import Accounts
from reame.chats.store import Store
from tests.browser_helpers import (  # noqa: F401 - browser and page are fixtures
    CHATS,
    browser,
    page,
    page_load,
    shown_as_loaded,
)
from tests.conftest import Server, start_server
from tests.gradio_api import ApiClient
from tests.page_events import PageSession
from tests.web.page.test_page_access import serious_violations

PASSWORDS = {"alice": "alice-secret-1", "carol": "carol-secret-3", "bob": "bob-secret-22"}
OLD_TITLES = ["Old recipe", "Old trip plan", "Old poem"]
NOTE = "#old-chats"
STATUS = "#users-status"
TABLE = "#users-table"
NOT_ADMIN = "Only an admin can manage users."


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    """Accounts on: alice (admin) and carol; three chats made before accounts (nobody's)."""
    folder = tmp_path_factory.mktemp("users")
    server = start_server(folder, model_path=model_path, max_tokens=8, start=False,
                          users={name: PASSWORDS[name] for name in ("alice", "carol")})
    store = Store(folder / "sessions" / "reame.db")
    for title in OLD_TITLES:
        store.create_chat(title=title, system_prompt="", temperature=0.0, top_p=1.0,
                          max_tokens=8)
    server.start()
    yield server
    server.stop()


def users_file(server: Server) -> Accounts:
    return Accounts(server.config.parent / "users.json")


def log_in(page: Page, server: Server, name: str, password: str | None = None) -> dict:
    """Log in with the page's form; the page's load answer, once the page shows it."""
    page.goto(server.url)
    page.fill("#username", name)
    page.fill("#password", password or PASSWORDS[name])
    with page.expect_response(page_load) as loaded:
        page.click("button[type=submit]")
    shown_as_loaded(page, loaded.value)
    return loaded.value.json()


def open_users(page: Page) -> None:
    page.get_by_role("tab", name="Users").click()
    expect(page.locator(TABLE)).to_contain_text("alice")


def choose(page: Page, dropdown: str, option: str) -> None:
    page.locator(f"{dropdown} input").click()
    page.locator(f"{dropdown} [role=option]").filter(has_text=option).first.click()


def titles(page: Page) -> list[str]:
    return [t.strip() for t in page.locator(f"{CHATS} .reame-title").all_inner_texts()]


def can_log_in(server: Server, name: str, password: str) -> bool:
    try:
        ApiClient(server.url, auth=(name, password), verbose=False)
        return True
    except Exception:  # noqa: BLE001 - gradio_client raises a plain Exception on a refusal
        return False


def v1_models(server: Server, key: str) -> int:
    request = urllib.request.Request(server.url + "v1/models",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_non_admin_sees_no_users_tab_and_its_events_are_refused_past_the_page(page, server):
    loaded = log_in(page, server, "carol")
    # Neither the tab nor the note, and nothing of them in the page's data.
    expect(page.get_by_role("tab", name="Chat")).to_be_visible()
    expect(page.get_by_role("tab", name="Users")).to_be_hidden()
    expect(page.locator(NOTE)).to_be_hidden()
    assert "alice" not in json.dumps(loaded) and "reame-users" not in json.dumps(loaded)

    # Past the page: carol's login sends the tab's events as the page would (raw HTTP) ...
    attacker = PageSession(server.url, "carol", PASSWORDS["carol"])
    try:
        add = attacker.fn_index("add-user", "click")
        assert attacker.run(add, "mallory", "mallory-secret", True) == (False, NOT_ADMIN)
        adopt_old = attacker.fn_index("adopt-old-chats", "click")
        assert attacker.run(adopt_old) == (False, NOT_ADMIN)
        # (Gradio refuses a user's name in a dropdown whose choices carol was never sent:
        # none, then, to reach the handler.)
        remove = attacker.fn_index("remove-user", "click")
        assert attacker.run(remove, None) == (False, NOT_ADMIN)
        assert "not in the list of choices" in attacker.run(remove, "alice")[1]
    finally:
        attacker.close()
    # ... and through gradio_client, told to call the page's private events all the same.
    client = ApiClient(server.url, auth=("carol", PASSWORDS["carol"]), verbose=False)
    for fn_index, args in ((add, ("mallory", "mallory-secret", True)),
                           (attacker.fn_index("new-key", "click"), (None,)),
                           (attacker.fn_index("set-password", "click"), (None, "taken-over-1"))):
        client.endpoints[fn_index].is_valid = True
        with pytest.raises(Exception, match=NOT_ADMIN):
            client.predict(*args, fn_index=fn_index)
    accounts = users_file(server)
    assert accounts.names() == ["alice", "carol"] and accounts.keys("alice") == []
    assert can_log_in(server, "alice", PASSWORDS["alice"])
    assert set(titles(page)).isdisjoint(OLD_TITLES)  # nothing was adopted


def test_the_admin_is_told_of_the_old_chats_and_adopts_them_in_one_click(page, server):
    log_in(page, server, "alice")
    note = page.locator(NOTE)
    expect(note).to_be_visible()
    expect(note).to_contain_text("3 chats from before accounts are not shown")
    assert set(titles(page)).isdisjoint(OLD_TITLES)
    assert serious_violations(page) == []
    note.get_by_role("button", name="Adopt them").click()
    expect(note).to_be_hidden()
    for title in OLD_TITLES:
        expect(page.locator(f"{CHATS} .reame-title").filter(has_text=title)).to_have_count(1)
    alice = ApiClient(server.url, auth=("alice", PASSWORDS["alice"]), verbose=False)
    assert set(OLD_TITLES) <= {c["title"] for c in alice.predict(api_name="/list_chats")}
    page.reload()
    expect(page.locator(f"{CHATS} .reame-title").filter(has_text=OLD_TITLES[0])).to_have_count(1)
    expect(note).to_be_hidden()


def test_an_admin_adds_a_user_who_logs_in_and_sees_only_their_own_chats(browser, page, server):
    log_in(page, server, "alice")
    open_users(page)
    assert serious_violations(page) == []
    # Refusals say why, with the CLI's words.
    page.fill("#new-user-name input", "bob")
    page.fill("#new-user-password input", "short")
    page.click("#add-user")
    expect(page.locator(STATUS)).to_contain_text("a password has at least 8 characters")
    expect(page.locator("#new-user-password input")).to_have_value("")  # never sent back
    page.fill("#new-user-name input", "carol")
    page.fill("#new-user-password input", "another-password")
    page.click("#add-user")
    expect(page.locator(STATUS)).to_contain_text("user 'carol' exists already")

    page.fill("#new-user-name input", "bob")
    page.fill("#new-user-password input", PASSWORDS["bob"])
    page.click("#add-user")
    expect(page.locator(STATUS)).to_contain_text("User bob added")
    expect(page.locator(TABLE).locator("tr", has_text="bob")).to_contain_text("no")
    expect(page.locator("#new-user-password input")).to_have_value("")

    bob_page = browser.new_context().new_page()
    try:
        log_in(bob_page, server, "bob")
        expect(bob_page.get_by_role("tab", name="Users")).to_be_hidden()
        expect(bob_page.locator("#chat-list")).to_contain_text("No chats yet")
        bob_page.click("#new-chat")
        expect(bob_page.locator(f"{CHATS} .reame-title")).to_have_text(["New chat"])
    finally:
        bob_page.context.close()
    bob = ApiClient(server.url, auth=("bob", PASSWORDS["bob"]), verbose=False)
    assert [c["title"] for c in bob.predict(api_name="/list_chats")] == ["New chat"]
    alice = ApiClient(server.url, auth=("alice", PASSWORDS["alice"]), verbose=False)
    assert "New chat" not in {c["title"] for c in alice.predict(api_name="/list_chats")}


def test_reset_a_password_make_and_revoke_a_key_and_remove_a_user(page, server):
    log_in(page, server, "alice")
    open_users(page)
    choose(page, "#user-pick", "bob")

    page.fill("#reset-password input", "bob-new-secret-9")
    page.click("#set-password")
    expect(page.locator(STATUS)).to_contain_text("Password of bob changed")
    expect(page.locator("#reset-password input")).to_have_value("")
    assert not can_log_in(server, "bob", PASSWORDS["bob"])
    assert can_log_in(server, "bob", "bob-new-secret-9")

    page.click("#new-key")
    key_box = page.locator("#new-key-value textarea, #new-key-value input")
    expect(key_box).to_be_visible()
    key = key_box.input_value()
    assert key.startswith("rk-")
    assert key not in (server.config.parent / "users.json").read_text()
    assert v1_models(server, key) == 200
    expect(page.locator(TABLE).locator("tr", has_text="bob")).to_contain_text("1 (")
    page.click("#revoke-key")
    expect(page.locator(STATUS)).to_contain_text("of bob revoked")
    assert v1_models(server, key) == 401
    expect(key_box).to_be_hidden()  # shown once

    # The last admin stays; a removed user's chats stay, for an admin to adopt.
    choose(page, "#user-pick", "alice")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#remove-user")
    expect(page.locator(STATUS)).to_contain_text("'alice' is the last admin and cannot be removed")
    choose(page, "#user-pick", "bob")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#remove-user")
    page.wait_for_timeout(500)
    assert "bob" in users_file(server).names(), "not removed unless confirmed"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#remove-user")
    expect(page.locator(STATUS)).to_contain_text("User bob removed; their chats stay")
    expect(page.locator(TABLE)).not_to_contain_text("bob")
    assert "bob" not in users_file(server).names()
    assert not can_log_in(server, "bob", "bob-new-secret-9")
    # bob's chat can be given to carol from here.
    choose(page, "#user-pick", "carol")
    choose(page, "#adopt-source", "of a removed user")
    page.click("#adopt-chats")
    expect(page.locator(STATUS)).to_contain_text("1 chat of u:")
    expect(page.locator(STATUS)).to_contain_text("now belongs to carol")
    carol = ApiClient(server.url, auth=("carol", PASSWORDS["carol"]), verbose=False)
    assert [c["title"] for c in carol.predict(api_name="/list_chats")] == ["New chat"]


def test_accounts_are_turned_on_old_chats_adopted_and_a_user_added_without_a_terminal(
        browser, page, tmp_path, model_path):
    """A server started without accounts (on this machine, open to whoever reaches it): its
    Users tab makes the first admin, and accounts are on at once, by every route."""
    server = start_server(tmp_path, model_path=model_path, max_tokens=8)
    try:
        anyone = ApiClient(server.url, verbose=False)
        for title in OLD_TITLES[:2]:
            anyone.predict(title, api_name="/new_chat")
        page.goto(server.url)
        page.get_by_role("tab", name="Users").click()
        expect(page.locator("#accounts-off")).to_contain_text("Accounts are off")
        expect(page.locator("#accounts-on")).to_be_hidden()
        assert serious_violations(page) == []
        page.fill("#first-admin-name input", "alice")
        page.fill("#first-admin-password input", PASSWORDS["alice"])
        page.fill("#first-admin-again input", PASSWORDS["alice"] + "x")
        page.click("#turn-accounts-on")
        expect(page.locator("#accounts-off-status")).to_contain_text("the passwords differ")
        assert "users_file = \n" in server.config.read_text(), "nothing written"
        page.fill("#first-admin-password input", PASSWORDS["alice"])
        page.fill("#first-admin-again input", PASSWORDS["alice"])
        # The page opens the event stream that carries its answer after its request, and here
        # late: after accounts are on (as a slow network or a busy browser may). The answer
        # still reaches it, while nobody else gets through to Gradio without a login.
        streams = []

        def late_stream(route):
            time.sleep(1.0)
            streams.append(route.request.url)
            route.continue_()

        page.route("**/gradio_api/queue/data**", late_stream)
        page.click("#turn-accounts-on")
        expect(page.locator("#accounts-off-status")).to_contain_text(
            "Accounts are on; user alice added (admin)")
        expect(page.locator("#first-admin-password input")).to_have_value("")
        assert streams, "the answer came by a stream opened after the request"
        page.unroute("**/gradio_api/queue/data**")
        for path in ("/config", "/gradio_api/info", "/gradio_api/queue/data?session_hash=x"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(server.url + path.lstrip("/"), timeout=10)
            assert refused.value.code == 401, path

        # On at once, by every route, and in reame.conf for the next start.
        assert "users_file = users.json" in server.config.read_text()
        assert Accounts(tmp_path / "users.json").is_admin("alice")
        with pytest.raises(Exception):
            ApiClient(server.url, verbose=False)
        assert v1_models(server, "rk-none") == 401

        # Log in, adopt the chats made so far, add bob: he sees none of them.
        page.click("#log-in-now")
        page.fill("#username", "alice")
        page.fill("#password", PASSWORDS["alice"])
        with page.expect_response(page_load) as load:
            page.click("button[type=submit]")
        shown_as_loaded(page, load.value)
        expect(page.locator(NOTE)).to_contain_text("2 chats from before accounts are not shown")
        page.locator(NOTE).get_by_role("button", name="Adopt them").click()
        expect(page.locator(NOTE)).to_be_hidden()
        for title in OLD_TITLES[:2]:
            expect(page.locator(f"{CHATS} .reame-title").filter(has_text=title)).to_have_count(1)
        open_users(page)
        expect(page.locator("#accounts-off")).to_be_hidden()
        page.fill("#new-user-name input", "bob")
        page.fill("#new-user-password input", PASSWORDS["bob"])
        page.click("#add-user")
        expect(page.locator(STATUS)).to_contain_text("User bob added")
        bob = ApiClient(server.url, auth=("bob", PASSWORDS["bob"]), verbose=False)
        assert bob.predict(api_name="/list_chats") == []

        # Once on, nobody turns them on again (alice's login, past the page).
        alice = PageSession(server.url, "alice", PASSWORDS["alice"])
        try:
            ok, said = alice.run(alice.fn_index("turn-accounts-on", "click"), "mallory",
                                 "mallory-secret", "mallory-secret")
            assert ok and "accounts are on already" in said[0]
        finally:
            alice.close()
        assert Accounts(tmp_path / "users.json").names() == ["alice", "bob"]
    finally:
        server.stop()
