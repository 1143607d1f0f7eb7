"""What a new user ran into on the page (Chromium, desktop and phone), each kept fixed: Esc
right after Enter keeps the message; a Stop while a message is read leaves it retriable;
turning accounts on sends the open page to the login; a document that left the model's window
is named; an unsupported file, a missing model, search snippets, a one-line document, the
phone's tabs and login card, and an admin's chat from before accounts are said in the page's
own words. And the words and layout around them: the trash icon's name, Esc in the search
box, a first visit's cache line, each message's speaker, Branch on hover, Markdown titles.

Helpers and fixtures: tests/browser_helpers.py (the shared server is `page_server` in
tests/conftest.py; tests that need another set-up start their own).
"""

from __future__ import annotations

import time

from playwright.sync_api import expect

from reame.chats.documents import Document, compose
from reame.chats.store import Store
from tests.browser_helpers import (  # noqa: F401 - browser, page, server are fixtures
    BOT,
    BOX,
    CHATS,
    CURRENT,
    ERROR_BADGE,
    REPLY_TIMEOUT,
    RETRY,
    STOP,
    TOAST,
    USER,
    VIEWPORT,
    api,
    browser,
    current_id,
    import_chat,
    new_chat,
    open_app,
    page,
    page_load,
    send,
    server,
    shown_as_loaded,
    wait_for_reply_done,
    wait_until,
)
from tests.conftest import start_server
from tests.inference.test_long_chat import FILLER, QUESTIONS

# About 3,000 characters, as the message of the report.
LONG = ("Here are my notes from the harbour. " + " ".join(
    f"Note {i}: boat {i} came back at {i % 12 + 1} o'clock with {i * 3} crates of fish."
    for i in range(45)) + " Summarize the notes.")


def test_esc_right_after_sending_keeps_the_message(page, browser, server_factory):
    """Esc 1.5 s after Enter, while the message still waits for the model (here behind another
    chat's reply, on a server of one slot): the message is kept in its chat, with no reply,
    as the Stop button keeps it (it was lost: the chat back to "Start a conversation.")."""
    assert len(LONG) > 2900
    busy = server_factory(slots=1, max_tokens=2000, n_ctx=4096)
    other = browser.new_page(viewport=VIEWPORT)
    try:
        open_app(other, busy)
        new_chat(other)
        other.locator(BOX).fill(LONG + " Then write a long story about each boat.")
        other.locator(BOX).press("Enter")
        expect(other.locator(STOP)).to_be_visible()
        open_app(page, busy)
        new_chat(page)
        box = page.locator(BOX)
        box.fill(LONG)
        box.press("Enter")
        expect(page.locator("#chatbot .reame-queued")).to_be_visible()
        time.sleep(1.5)
        box.press("Escape")
        expect(page.locator(STOP)).to_have_count(0, timeout=REPLY_TIMEOUT)
        # The message stays: stored in its chat and shown, as the Stop button keeps it.
        expect(page.locator(USER)).to_have_count(1)
        expect(page.locator(BOX)).to_have_value("")
        kept = api(busy).predict(current_id(page), api_name="/get_chat")["messages"]
        assert [m["role"] for m in kept] == ["user"] and kept[0]["content"] == LONG
    finally:
        other.close()


def test_a_stop_while_the_message_is_read_leaves_it_retriable(page, server):
    """Esc while the message is still being read: no reply, so the chat says why in the
    reply's place, and its Retry answers the message."""
    open_app(page, server)
    new_chat(page)
    box = page.locator(BOX)
    box.fill(LONG)
    box.press("Enter")
    client = api(server)
    chat_id = current_id(page)
    wait_until(lambda: client.predict(chat_id, api_name="/get_chat")["messages"],
               "the message was never stored")
    box.press("Escape")
    expect(page.locator(STOP)).to_have_count(0, timeout=REPLY_TIMEOUT)
    kept = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in kept] == ["user"], "a reply began before Esc: too fast a machine"
    expect(page.locator(BOT)).to_have_count(1)
    expect(page.locator(BOT)).to_contain_text("stopped before the reply began")
    page.locator(RETRY).click()
    wait_for_reply_done(page, 1)
    expect(page.locator(USER)).to_have_count(1)
    expect(page.locator(BOT)).to_have_count(1)
    kept = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["role"] for m in kept] == ["user", "assistant"]


def test_turning_accounts_on_sends_the_open_page_to_the_login(page, server_factory):
    """The admin's own page, once accounts are on: its next click goes to the login page, not
    to red "Error" pills and a "Not authenticated" toast."""
    open_server = server_factory(max_tokens=8)
    client = api(open_server)
    client.predict("Before accounts", api_name="/new_chat")
    open_app(page, open_server)
    page.get_by_role("tab", name="Users").click()
    page.fill("#first-admin-name input", "alice")
    page.fill("#first-admin-password input", "alice-secret-1")
    page.fill("#first-admin-again input", "alice-secret-1")
    page.click("#turn-accounts-on")
    expect(page.locator("#accounts-off-status")).to_contain_text("Accounts are on")
    page.get_by_role("tab", name="Chat").click()
    page.locator(CHATS).first.click()
    expect(page.locator("#username")).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(page.locator(TOAST)).to_have_count(0)


def test_a_document_that_left_the_model_s_memory_is_named(page, server_factory):
    """A chat whose first message carries a document outgrows a small context: the marker
    where the model's memory starts names the document it no longer reads."""
    small = server_factory(n_ctx=512, max_tokens=16)
    notes = ("The lighthouse keeper logs every ship that passes the point. " * 12).strip()
    first = compose([Document("keeper.md", notes)], "Who logs the ships?")
    chat_id = import_chat(api(small), "Keeper", [first, "The lighthouse keeper."])
    open_app(page, small, f"?chat={chat_id}")
    marker = page.locator("#chatbot .reame-window")
    for n in range(6):
        if marker.count():
            break
        send(page, FILLER + QUESTIONS[n % 2])
    expect(marker).to_have_count(1)
    expect(marker).to_contain_text("it no longer reads keeper.md")


def test_an_unsupported_file_is_named_in_the_page_s_own_words(page, server, tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    open_app(page, server)
    new_chat(page)
    with page.expect_file_chooser() as chooser:
        page.click("#attach")
    chooser.value.set_files(str(photo))
    expect(page.locator("#reame-hint")).to_have_text(
        "Not attached: photo.png: only text, Markdown, code and PDF files can be attached.")
    page.wait_for_timeout(1000)  # Gradio's refusal came within it
    expect(page.locator(TOAST)).to_have_count(0)
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(page.locator("#attached li")).to_have_count(0)


def test_a_missing_model_is_not_called_a_cache_turned_off(page, server_factory):
    missing = server_factory(model_path="models/does-not-exist.gguf")
    open_app(page, missing)
    line = page.locator("#cache-stats")
    expect(line).to_have_text("No model is loaded, so no chat is kept ready to continue yet.")
    expect(line).not_to_contain_text("**")


def test_search_results_show_a_document_s_words_not_its_markup(page, server):
    first = compose([Document("keeper.pdf", "The lighthouse keeper logged forty ships.")],
                    "How many ships?")
    import_chat(api(server), "Lighthouse log", [first, "Forty."])
    open_app(page, server)
    page.fill("#chat-search textarea, #chat-search input", "logged")
    snippet = page.locator("#chat-list .reame-snippet").filter(has_text="keeper")
    expect(snippet).to_have_count(1)
    expect(snippet).to_contain_text("keeper.pdf: The lighthouse keeper logged forty ships.")
    assert "document" not in snippet.inner_text() and '">' not in snippet.inner_text()


def test_a_one_line_document_is_one_line(page, server):
    first = compose([Document("keeper.pdf", "The lamp is lit.")], "Is the lamp lit?")
    chat_id = import_chat(api(server), "One line", [first, "Yes."])
    open_app(page, server, f"?chat={chat_id}")
    expect(page.locator(f"{USER} details.reame-doc summary")).to_have_text(
        "Attached: keeper.pdf · 1 line")


PHONE = {"width": 390, "height": 844}


def overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def test_on_a_phone_the_sidebar_button_leaves_the_chat_tab_readable(page, server):
    page.set_viewport_size(PHONE)
    open_app(page, server)
    toggle = page.locator(".sidebar .toggle-button")
    tab = page.get_by_role("tab", name="Chat")
    expect(tab).to_be_visible()
    expect(page.locator(".sidebar.open")).to_have_count(0)
    page.wait_for_timeout(500)  # the sidebar's slide
    assert not overlap(toggle.bounding_box(), tab.bounding_box()), (
        toggle.bounding_box(), tab.bounding_box())


def test_on_a_phone_the_login_card_fits_the_screen(browser, tmp_path, model_path):
    with_accounts = start_server(tmp_path, model_path=model_path,
                                 users={"alice": "alice-secret-1"})
    phone = browser.new_page(viewport=PHONE)
    try:
        phone.goto(with_accounts.url)
        card = phone.locator("main")
        expect(phone.locator("#username")).to_be_visible()
        box = card.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    finally:
        phone.close()
        with_accounts.stop()


def test_an_admin_logging_in_on_a_chat_from_before_accounts_is_told_where_it_went(
        browser, tmp_path, model_path):
    """The admin's page, open on a chat before accounts were turned on, after the login: not
    "That chat is not here." beside "No chats yet" and the server's chats ready."""
    with_accounts = start_server(tmp_path, model_path=model_path, start=False,
                                 users={"alice": "alice-secret-1"})
    old = Store(tmp_path / "sessions" / "reame.db").create_chat(
        title="Old recipe", system_prompt="", temperature=0.0, top_p=1.0, max_tokens=8)
    with_accounts.start()
    admin = browser.new_page(viewport=VIEWPORT)
    try:
        admin.goto(f"{with_accounts.url}?chat={old.id}")
        admin.fill("#username", "alice")
        admin.fill("#password", "alice-secret-1")
        with admin.expect_response(page_load) as loaded:
            admin.click("button[type=submit]")
        shown_as_loaded(admin, loaded.value)
        expect(admin.locator("#chat-note")).to_have_text(
            "That chat is from before accounts: “Adopt them” brings it into your list.")
        expect(admin.locator("#old-chats")).to_contain_text("1 chat from before accounts")
        expect(admin.locator("#cache-stats .reame-cache-line")).to_contain_text(
            "on the server")
    finally:
        admin.close()
        with_accounts.stop()


def test_the_trash_icon_is_named_for_what_it_does(page, server):
    chat_id = import_chat(api(server), "Named trash", ["Hello.", "Hi."])
    open_app(page, server, f"?chat={chat_id}")
    trash = page.locator("#chatbot button[aria-label='Delete this chat']")
    expect(trash).to_have_count(1)
    expect(trash).to_have_attribute("title", "Delete this chat")
    expect(page.locator("#chatbot button[aria-label=Clear]")).to_have_count(0)


def test_esc_in_the_search_box_clears_it(page, server):
    import_chat(api(server), "Found again", ["Hello.", "Hi."])
    open_app(page, server)
    search = page.locator("#chat-search textarea, #chat-search input")
    search.fill("no chat is called this")
    expect(page.locator(CHATS)).to_have_count(0)
    search.press("Escape")
    expect(search).to_have_value("")
    expect(page.locator(CHATS).first).to_be_visible()


def test_a_first_visit_says_no_chat_is_ready_yet_rather_than_zeros(page, server_factory):
    fresh = server_factory()
    open_app(page, fresh)
    expect(page.locator("#cache-stats .reame-cache-line")).to_have_text(
        "No chat is kept ready to continue yet.")


def test_to_a_screen_reader_each_message_says_who_wrote_it(page, server):
    chat_id = import_chat(api(server), "Speakers", ["Hello.", "Hi."])
    open_app(page, server, f"?chat={chat_id}")
    expect(page.get_by_role("article", name="You said")).to_contain_text("Hello.")
    expect(page.get_by_role("article", name="Reame replied")).to_contain_text("Hi.")


def test_branch_from_here_shows_on_the_reply_the_mouse_is_over(page, server):
    chat_id = import_chat(api(server), "Branches", ["Hello.", "Hi.", "And now?", "Still hi."])
    open_app(page, server, f"?chat={chat_id}")
    branches = page.locator("#chatbot .reame-tool[title='Branch from here']")
    expect(branches).to_have_count(2)
    page.mouse.move(1, 1)
    opacity = "el => getComputedStyle(el).opacity"
    wait_until(lambda: [b.evaluate(opacity) for b in branches.all()] == ["0", "0"],
               "a Branch button shows with no reply under the mouse")
    page.locator(BOT).last.hover()
    wait_until(lambda: [b.evaluate(opacity) for b in branches.all()] == ["0", "1"],
               "the reply under the mouse shows no Branch button")


def test_a_title_made_from_markdown_is_its_heading(page, server):
    open_app(page, server)
    new_chat(page)
    send(page, "# Harbour Co-op: Field Notes\n\n## Summary\n\nThe boats came back at dawn.")
    expect(page.locator(f"{CURRENT} .reame-title")).to_have_text("Harbour Co-op: Field Notes")


def test_to_a_screen_reader_the_message_box_is_message(page, server):
    open_app(page, server)
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_have_count(1)
