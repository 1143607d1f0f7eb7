"""The chat list's HTML (no browser): users' titles and messages are text, never markup; the
current chat is the list's one Tab stop; a long list says how to find the rest."""

from __future__ import annotations

import html

from reame.chats.messages import END_MARK, MARK, ChatInfo, FoundChat
from reame.chats.store import Store
from reame.web.page.chat_list import SHOWN, chat_list_html, search_results_html

ATTACK = '<img src=x onerror="alert(1)">" data-reame-action="delete:999'


def make(store, title, text=""):
    chat = store.create_chat(title=title, system_prompt="", temperature=0.5, top_p=1.0,
                             max_tokens=10)
    if text:
        store.add_message(chat.id, "user", text)
    return ChatInfo.of(store.get_chat(chat.id))


def test_titles_and_snippets_are_text(tmp_path):
    store = Store(tmp_path / "reame.db")
    chat = make(store, ATTACK, f"look {ATTACK} zebra")
    listed = chat_list_html([chat], chat.id)
    found = search_results_html([FoundChat.of(f) for f in store.search(None, "zebra")],
                                chat.id, ATTACK)
    for page in (listed, found):
        assert "<img" not in page and 'data-reame-action="delete:999' not in page
        assert html.escape(ATTACK) in page
    assert "<mark>zebra</mark>" in found
    assert MARK not in found and END_MARK not in found


def test_the_current_chat_and_its_menu_are_the_only_tab_stops(tmp_path):
    store = Store(tmp_path / "reame.db")
    chats = [make(store, f"chat {n}") for n in range(3)]
    page = chat_list_html(chats, chats[1].id)
    assert page.count('tabindex="0"') == 2 and page.count('aria-current="page"') == 1
    assert page.index('aria-current="page"') > page.index("chat 0")
    current = page[page.index('data-chat="%d"' % chats[1].id):]
    current = current[:current.index("</li>")]
    assert current.count('tabindex="0"') == 2, "its button and its ⋯"


def test_a_long_list_shows_the_most_recent_and_says_so(tmp_path):
    store = Store(tmp_path / "reame.db")
    chats = [make(store, f"chat {n}") for n in range(SHOWN + 5)]
    page = chat_list_html(chats, None)
    assert page.count('class="reame-open"') == SHOWN
    assert f"Showing the {SHOWN} most recent of {SHOWN + 5} chats" in page
    assert "No chat holds “nothing”" in search_results_html([], None, "nothing")
