"""The chat list in a real browser: each chat shows its own messages (a reply that goes on
while another chat is shown: tests/web/page/test_page_live.py), rename in place, delete, groups, pins,
search and keys, export and import, copy; and with accounts, Reame's login page and only your
own chats. Also writes docs/screenshots/chat-list.png.

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; the accounts test starts its own).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from reame.chats.service import title_from
from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    CAPITAL,
    CHATS,
    CURRENT,
    EDIT,
    EDIT_BOX,
    ERROR_BADGE,
    REPLY_TIMEOUT,
    SCREENSHOTS,
    STATS,
    UI_TIMEOUT,
    USER,
    VIEWPORT,
    address,
    api,
    browser,
    chat_menu,
    current_chat,
    import_chat,
    new_chat,
    open_app,
    page,
    reload,
    selected_title,
    send,
    server,
    wait_for_reply_done,
    without_stats,
    words,
)
from tests.conftest import start_server
from tests.reference import assert_answers, model_answer


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
        stored = current_chat(server, page, title_from(shown))["messages"]
        assert words(without_stats(page.locator(BOT).inner_text())) == words(stored[1]["content"])
        expect(page.locator("#chatbot")).not_to_contain_text(other)


def test_rename_inline_from_the_chat_s_menu(page, server):
    client = api(server)
    chat_id = client.predict("Before the rename", None, api_name="/new_chat")
    open_app(page, server)
    assert selected_title(page) == "Before the rename", "the newest chat is shown first"

    chat_menu(page, "Before the rename", "Rename")
    title_box = page.locator("#chat-list input.reame-rename")
    expect(title_box).to_be_focused()
    expect(title_box).to_have_value("Before the rename")
    title_box.fill("Renamed in the browser")
    title_box.press("Enter")
    expect(page.locator(CHATS).filter(has_text="Renamed in the browser")).to_have_count(1)
    expect(page.locator(CHATS).filter(has_text="Before the rename")).to_have_count(0)
    assert selected_title(page) == "Renamed in the browser"
    assert client.predict(chat_id, api_name="/get_chat")["title"] == "Renamed in the browser"

    # Esc, or an empty title, leaves the title as it was; no "Error" badge anywhere.
    for keys in ("Escape", "Enter"):
        chat_menu(page, "Renamed in the browser", "Rename")
        title_box.fill("   " if keys == "Enter" else "Not this")
        title_box.press(keys)
        expect(title_box).to_have_count(0)
        expect(page.locator(CHATS).filter(has_text="Renamed in the browser")).to_have_count(1)
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    assert client.predict(chat_id, api_name="/get_chat")["title"] == "Renamed in the browser"


def test_delete_asks_first_naming_the_chat_and_removes_it(page, server):
    client = api(server)
    chat_id = client.predict("Chat to delete", None, api_name="/new_chat")
    open_app(page, server)
    assert selected_title(page) == "Chat to delete"
    questions = []

    def answer(dialog, accept):
        questions.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, False))
    chat_menu(page, "Chat to delete", "Delete")
    expect(page.locator(CHATS).filter(has_text="Chat to delete")).to_have_count(1)
    assert questions == ["Delete “Chat to delete” and all its messages? This cannot be undone."]
    assert chat_id in [c["id"] for c in client.predict(api_name="/list_chats")]

    page.once("dialog", lambda dialog: answer(dialog, True))
    chat_menu(page, "Chat to delete", "Delete")
    expect(page.locator(CHATS).filter(has_text="Chat to delete")).to_have_count(0)
    assert chat_id not in [c["id"] for c in client.predict(api_name="/list_chats")]
    with pytest.raises(Exception, match="does not exist"):
        client.predict(chat_id, api_name="/get_chat")
    # Another chat (the most recently active left, pinned or not) is shown and selected.
    listed = client.predict(api_name="/list_chats")
    latest = max(listed, key=lambda c: (c["updated_at"], c["id"]))
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text(latest["title"])


def test_the_list_groups_by_day_pins_searches_and_moves_with_the_keys(page, server):
    client = api(server)
    marker = "zanzibar"
    with_word = client.predict("Spice islands", None, api_name="/new_chat")
    client.predict(with_word, f"Tell me one fact about {marker.title()}.", api_name="/send")
    pinned = client.predict("Pinned notes", None, api_name="/new_chat")
    open_app(page, server)
    groups = page.locator("#chat-list .reame-group")
    expect(groups.first).to_have_text("Today")

    chat_menu(page, "Pinned notes", "Pin")
    expect(groups.first).to_have_text("Pinned")
    expect(page.locator(CHATS).first).to_contain_text("Pinned notes")
    # Only the list scrolls: what is below it stays in view, however many chats there are.
    expect(page.locator("#chat-list")).to_have_css("overflow-y", "auto")
    expect(page.locator("#export-all")).to_be_in_viewport()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "chat-list.png")
    assert client.predict(api_name="/list_chats")[0]["id"] == pinned

    # Search by a word of a message: the chat, with the snippet that matched.
    page.keyboard.press("Control+k")
    search = page.locator("#chat-search input, #chat-search textarea")
    expect(search).to_be_focused()
    search.press_sequentially(marker[:5])
    expect(page.locator(CHATS)).to_have_count(1)
    expect(page.locator(CHATS)).to_contain_text("Spice islands")
    expect(page.locator("#chat-list .reame-snippet mark").first).to_have_text(
        re.compile(f"^{marker[:5]}", re.IGNORECASE))
    page.locator(CHATS).click()
    expect(page.locator(USER)).to_have_text([f"Tell me one fact about {marker.title()}."])
    expect(search).to_have_value("")
    expect(page.locator(BOX)).to_be_focused()

    # The list is one Tab stop: the arrow keys move between chats, Enter opens one.
    page.locator(f"{CHATS}[aria-current=page]").focus()
    page.keyboard.press("ArrowUp")
    expect(page.locator(CHATS).first).to_be_focused()
    page.keyboard.press("Enter")
    assert_selected = expect(page.locator(f"{CHATS}[aria-current=page]"))
    assert_selected.to_contain_text("Pinned notes")
    assert page.locator(f'{CHATS}[tabindex="0"]').count() == 1


def test_new_chat_twice_makes_one_empty_chat_and_shortcuts_work(page, server):
    open_app(page, server)
    new_chat(page)
    count = page.locator(CHATS).count()
    page.click("#new-chat")
    page.keyboard.press("Control+Shift+O")
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text("New chat")
    expect(page.locator(BOX)).to_be_focused()
    assert page.locator(CHATS).count() == count, "the empty new chat is reused"


def test_with_accounts_the_page_asks_for_a_login_and_shows_only_your_chats(
        browser, tmp_path, model_path):
    from tests.accounts.test_accounts import PASSWORDS

    server = start_server(tmp_path, model_path=model_path, max_tokens=16,
                          users={name: PASSWORDS[name] for name in ("alice", "bob")})
    try:
        pages = {}
        for name in ("alice", "bob"):
            context = browser.new_context(viewport=VIEWPORT)
            context.set_default_timeout(UI_TIMEOUT)
            page = pages[name] = context.new_page()
            page.goto(server.url)
            expect(page).to_have_title("Reame · Log in")
            expect(page.get_by_text("Log in with your user name and password")).to_be_visible()
            if name == "alice":  # a wrong password first: said, and the name stays
                page.get_by_label("User name").fill(name)
                page.get_by_label("Password").fill("not the password")
                page.get_by_role("button", name="Log in").click()
                expect(page.get_by_role("alert")).to_have_text("Wrong user name or password.")
                expect(page.get_by_label("User name")).to_have_value(name)
                expect(page.get_by_label("Password")).to_be_focused()
            else:
                page.get_by_label("User name").fill(name)
            page.get_by_label("Password").fill(PASSWORDS[name])
            page.get_by_role("button", name="Log in").click()
            expect(page.locator(BOX)).to_be_editable()
            # Who is signed in, and a way out; the Settings tab only for the admin (alice,
            # the first user).
            expect(page.locator("#account")).to_have_text(f"Signed in as {name} · Log out")
            settings_tab = page.get_by_role("tab", name="Settings")
            if name == "alice":
                expect(settings_tab).to_be_visible()
            else:
                expect(settings_tab).to_be_hidden()
        alice = pages["alice"]
        assert_answers(without_stats(send(alice, CAPITAL)), model_answer(CAPITAL, max_tokens=64))
        expect(alice.locator(CHATS)).to_have_count(1)
        bob = pages["bob"]
        bob.reload()
        expect(bob.locator(BOX)).to_be_editable()
        expect(bob.locator(CHATS)).to_have_count(0)
        expect(bob.locator(USER)).to_have_count(0)
        # Log out: back to the login page; the chats are not shown any more.
        bob.get_by_role("link", name="Log out").click()
        expect(bob).to_have_title("Reame · Log in")
        bob.goto(server.url)
        expect(bob.get_by_label("User name")).to_be_visible()
        for page in pages.values():
            page.context.close()
    finally:
        server.stop()


def test_export_a_chat_and_import_it_and_a_chatgpt_export_back(page, server, tmp_path):
    client = api(server)
    chat_id = client.predict("Export me", None, api_name="/new_chat")
    client.predict(chat_id, "Name a river in Africa.", api_name="/send")
    open_app(page, server)

    with page.expect_download() as download:
        chat_menu(page, "Export me", "Export (JSON)")
    assert download.value.suggested_filename == "Export-me.json"
    exported = tmp_path / "Export-me.json"
    download.value.save_as(exported)
    document = json.loads(exported.read_text())
    assert document["format"] == "reame-chat" and document["title"] == "Export me"
    assert [m["role"] for m in document["messages"]] == ["user", "assistant"]
    with page.expect_download() as markdown:
        chat_menu(page, "Export me", "Export (Markdown)")
    assert markdown.value.suggested_filename == "Export-me.md"

    # Importing it makes a second chat (a copy), shown at once; a ChatGPT export adds its
    # chats.
    before = page.locator(CHATS).count()
    import_file(page, exported)
    expect(page.locator(CHATS)).to_have_count(before + 1)
    expect(page.locator(USER)).to_have_text(["Name a river in Africa."])
    assert selected_title(page) == "Export me"
    chatgpt = Path(__file__).parents[2] / "data" / "chatgpt_conversations.json"
    titles = [c["title"] for c in json.loads(chatgpt.read_text())]
    import_file(page, chatgpt)
    for title in titles:
        expect(page.locator(CHATS).filter(has_text=title)).to_have_count(1)
    # ... in the list by their own dates (2024), not under Today, the day of the import.
    for conversation in json.loads(chatgpt.read_text()):
        row = page.locator(CHATS).filter(has_text=conversation["title"])
        group = row.evaluate("b => b.closest('ul').previousElementSibling.textContent")
        assert group == "May 2024" or group.endswith("2024"), group
        listed = [c for c in client.predict(api_name="/list_chats")
                  if c["title"] == conversation["title"]]
        assert listed and abs(listed[0]["updated_at"] - conversation["update_time"]) < 120
    # The same file again: nothing doubled, and the page says why.
    count = page.locator(CHATS).count()
    import_file(page, chatgpt)
    expect(page.locator(".toast-body").filter(has_text="2 were here already")).to_be_visible()
    assert page.locator(CHATS).count() == count
    # A file that is not an export is refused, saying why; nothing is added.
    bad = tmp_path / "notes.json"
    bad.write_text('{"notes": []}')
    count = page.locator(CHATS).count()
    import_file(page, bad)
    expect(page.locator(".toast-body").filter(has_text="Nothing was imported")).to_be_visible()
    assert page.locator(CHATS).count() == count


def import_file(page, path: Path) -> None:
    """Press Import and choose the file at path."""
    with page.expect_file_chooser() as chooser:
        page.click("#import-chats")
    chooser.value.set_files(path)


def test_copying_a_reply_copies_its_text_without_the_stats_line(page, server):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_app(page, server)
    new_chat(page)
    shown = send(page, "Name the largest ocean.")
    page.locator("#chatbot [data-testid=bot]").last.hover()
    page.locator("#chatbot button[aria-label='Copy message']").last.click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.strip() and "reame-" not in copied and "<div" not in copied, copied
    assert words(copied) == words(without_stats(shown))


def test_a_title_with_spaces_is_typed_not_sent(page, server):
    """Renaming by typing (a space, then Enter): the space is the title's, not a click on the
    row, and nothing reaches the message box or the model."""
    client = api(server)
    chat_id = client.predict("Trip plans", None, api_name="/new_chat")
    open_app(page, server)
    chat_menu(page, "Trip plans", "Rename")
    title_box = page.locator("#chat-list input.reame-rename")
    title_box.press("Control+a")
    title_box.press_sequentially("Lisbon trip")
    title_box.press("Enter")
    expect(page.locator(CHATS).filter(has_text="Lisbon trip")).to_have_count(1)
    assert client.predict(chat_id, api_name="/get_chat")["title"] == "Lisbon trip"
    assert client.predict(chat_id, api_name="/get_chat")["messages"] == []
    expect(page.locator(BOX)).to_have_value("")
    expect(page.locator(USER)).to_have_count(0)


def test_clearing_the_search_shows_every_chat_again(page, server):
    client = api(server)
    client.predict("Searchable chat", None, api_name="/new_chat")
    open_app(page, server)
    everyone = page.locator(CHATS).count()
    search = page.locator("#chat-search input, #chat-search textarea")
    search.click()
    search.press_sequentially("zzzqqq")
    expect(page.locator("#chat-list")).to_contain_text("zzzqqq")
    expect(page.locator(CHATS)).to_have_count(0)
    for _ in range(6):
        search.press("Backspace")
    expect(search).to_have_value("")
    expect(page.locator(CHATS)).to_have_count(everyone)


def test_the_chat_s_trash_icon_deletes_it_after_asking(page, server):
    """The Chatbot's trash icon (named "Delete this chat", not Gradio's "Clear"): no, and the
    chat is shown again whole; yes, and it is deleted, as the list's Delete does. It used to
    open a new chat and delete nothing."""
    client = api(server)
    chat_id = client.predict("Trash can", None, api_name="/new_chat")
    client.predict(chat_id, "Say hi.", api_name="/send")
    open_app(page, server)
    assert selected_title(page) == "Trash can"
    expect(page.locator(USER)).to_have_text(["Say hi."])
    listed = len(client.predict(api_name="/list_chats"))
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    page.locator("#chatbot button[aria-label='Delete this chat']").click()
    expect(page.locator(USER)).to_have_text(["Say hi."])
    assert questions == ["Delete “Trash can” and all its messages? This cannot be undone."]
    assert selected_title(page) == "Trash can"
    assert len(client.predict(api_name="/list_chats")) == listed, "no chat made or deleted"

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#chatbot button[aria-label='Delete this chat']").click()
    expect(page.locator(CHATS).filter(has_text="Trash can")).to_have_count(0)
    assert chat_id not in [c["id"] for c in client.predict(api_name="/list_chats")]
    assert len(client.predict(api_name="/list_chats")) == listed - 1


def test_the_list_takes_two_tab_stops_its_chosen_chat_and_that_chat_s_menu(page, server):
    """From the search box, Tab reaches the chosen chat, then its ⋯, then leaves the list:
    the other rows' ⋯ buttons are no Tab stops (27 of them made the page a slog)."""
    client = api(server)
    for n in range(3):
        client.predict(f"Tab stop {n}", None, api_name="/new_chat")
    open_app(page, server)
    page.locator("#chat-search input, #chat-search textarea").focus()
    page.keyboard.press("Tab")
    expect(page.locator(CURRENT)).to_be_focused()
    page.keyboard.press("Tab")
    focused_in_row = page.evaluate(
        "() => document.activeElement.closest('.reame-row')?.querySelector('.reame-open')"
        "?.getAttribute('aria-current')")
    assert page.evaluate("() => document.activeElement.tagName") == "SUMMARY"
    assert focused_in_row == "page", "the chosen chat's own menu"
    page.keyboard.press("Tab")
    assert not page.evaluate("() => !!document.activeElement.closest('#chat-list')")
    # The arrow keys move the two stops to another row.
    page.locator(CURRENT).focus()
    page.keyboard.press("ArrowDown")
    assert page.locator("#chat-list summary[tabindex='0']").count() == 1


def test_the_address_names_the_chat_shown_and_back_and_forward_retrace_the_chats(page, server):
    """?chat=ID in the address bar, the rest of the address kept; Back and Forward go between
    the chats opened; a reload or the address opened anew shows that chat; New chat drops
    it."""
    client = api(server)
    ids = {city: import_chat(client, f"Address {city}", [f"Where is {city}?", "Far north."])
           for city in ("Oslo", "Lima")}

    def shows(city: str) -> None:
        expect(page.locator(USER)).to_have_text([f"Where is {city}?"])
        assert selected_title(page) == f"Address {city}"
        assert address(page) == {"lang": "en", "chat": str(ids[city])}
        assert page.url.startswith(server.url + "?"), page.url

    open_app(page, server, "?lang=en")
    for city in ("Oslo", "Lima"):
        page.locator(CHATS).filter(has_text=f"Address {city}").click()
        shows(city)
    page.go_back()
    shows("Oslo")
    page.go_forward()
    shows("Lima")
    reload(page)
    shows("Lima")
    open_app(page, server, f"?lang=en&chat={ids['Oslo']}")
    shows("Oslo")
    expect(page.locator("#chat-note")).to_be_hidden()
    # A new chat is no chat to name; Back goes back to the chat before it.
    new_chat(page)
    expect(page).to_have_url(re.compile(r"\?lang=en$"))
    page.go_back()
    shows("Oslo")


def test_each_message_and_each_chat_says_when_it_was_written_on_hover(browser, server):
    """In the person's own time (the browser's time zone, here India's, UTC+5:30)."""
    context = browser.new_context(viewport=VIEWPORT, timezone_id="Asia/Kolkata",
                                  locale="en-GB")
    context.set_default_timeout(UI_TIMEOUT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        client = api(server)
        # 1 May 2024, 10:00:00 and 10:01:03 UTC.
        chat_id = import_chat(client, "Written when", ["Hello there.", "Hi!"],
                              [1714557600.5, 1714557663.0])
        open_app(page, server, f"?chat={chat_id}")
        expect(page.locator(USER)).to_have_attribute("title", "1 May 2024, 15:30")
        expect(page.locator(BOT)).to_have_attribute("title", "1 May 2024, 15:31")
        updated = next(c["updated_at"] for c in client.predict(api_name="/list_chats")
                       if c["id"] == chat_id)
        local = datetime.fromtimestamp(updated, ZoneInfo("Asia/Kolkata"))
        expect(page.locator(CURRENT)).to_have_attribute("title", re.compile(
            rf"^Written when\nLast updated {local.day} \w+ {local.year}, {local:%H:%M}$"))
        # The time is the page's, not the message's: editing shows the text alone.
        page.locator(USER).hover()
        page.locator(EDIT).click()
        expect(page.locator(EDIT_BOX)).to_have_value("Hello there.")
        assert errors == []
    finally:
        context.close()
