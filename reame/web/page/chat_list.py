"""The sidebar's chat list as HTML: one row per chat (title cut with "…", a menu of actions),
pinned chats first, or the chats a search found with their matching snippet.

Every control carries a data-reame-action that the page's script sends to the server
(parts.PAGE_JS, page.js); the script also groups the rows by the browser's own day (Today,
Yesterday, ...) from their data-updated time, and moves between them with the arrow keys.
Titles and snippets are users' text: escaped here, never markup.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

from reame.chats.messages import END_MARK, MARK, ChatInfo, FoundChat

if TYPE_CHECKING:
    from reame.chats.service import ChatService

SHOWN = 200  # rows at most; older chats are found by searching


def chat_list_html(chats: list[ChatInfo], current: int | None, *, total: int | None = None,
                   writing: frozenset[int] = frozenset(), archived: int = 0) -> str:
    """The list of chats (pinned first, then most recent), current one marked; total: how
    many the user has (when chats holds only the first SHOWN); writing: the chats whose reply
    is being written (marked so); archived: how many chats are archived (a button shows
    them)."""
    more = (f'<button class="reame-archived-link" data-reame-action="archived:0">Archived '
            f"chats ({archived:,})</button>" if archived else "")
    if not chats:
        return _nav(f'<p class="reame-list-note">No chats yet.</p>{more}')
    rows = [_row(chat, chat.id == current, writing=chat.id in writing)
            for chat in chats[:SHOWN]]
    total = len(chats) if total is None else total
    note = (f'<p class="reame-list-note">Showing the {SHOWN:,} most recent of {total:,} '
            "chats: search to find the others.</p>" if total > SHOWN else "")
    return _nav(f'<ul class="reame-rows">{"".join(rows)}</ul>{note}{more}')


def archived_html(chats: list[ChatInfo], current: int | None, *,
                  writing: frozenset[int] = frozenset()) -> str:
    """The archived chats, with the way back to the list."""
    back = '<button class="reame-archived-link" data-reame-action="chats:0">← All chats</button>'
    if not chats:
        body = '<p class="reame-list-note">No archived chats.</p>'
    else:
        body = "".join(_row(chat, chat.id == current, writing=chat.id in writing)
                       for chat in chats)
        body = f'<ul class="reame-rows">{body}</ul>'
    return _nav(f'<p class="reame-list-note">Archived chats</p>{body}{back}', archived=True)


def search_results_html(found: list[FoundChat], current: int | None, words: str, *,
                        writing: frozenset[int] = frozenset()) -> str:
    """The chats a search for words found, each with a snippet of a matching message."""
    if not found:
        return _nav(f'<p class="reame-list-note">No chat holds “{html.escape(words)}”.</p>',
                    searching=True)
    rows = [_row(f.chat, f.chat.id == current, snippet=f.snippet, writing=f.chat.id in writing)
            for f in found]
    return _nav(f'<ul class="reame-rows">{"".join(rows)}</ul>', searching=True)


def _nav(body: str, *, searching: bool = False, archived: bool = False) -> str:
    label = "Search results" if searching else "Archived chats" if archived else "Chats"
    return (f'<nav class="reame-chats" aria-label="{label}" '
            f'data-searching="{str(searching or archived).lower()}">{body}</nav>')


def _row(chat: ChatInfo, current: bool, *, snippet: str = "", writing: bool = False) -> str:
    title = html.escape(chat.title)
    shown = _snippet_html(snippet) if snippet else ""
    if writing:  # a reply goes on being written there while another chat is shown
        shown += ('<span class="reame-writing">'
                  '<span aria-hidden="true">● </span>writing a reply…</span>')
    if chat.archived:
        shown += '<span class="reame-archived-tag">Archived</span>'
    pin = "Unpin" if chat.pinned else "Pin"
    archive = "Unarchive" if chat.archived else "Archive"
    marked = ' aria-current="page"' if current else ""
    # The chat's button opens it; only the current one and its ⋯ are Tab stops (the arrow keys
    # move between rows), so that the message box is a few Tabs away whatever the number of
    # chats (page.js keeps it so as the arrows move).
    return (
        f'<li class="reame-row" data-chat="{chat.id}" data-updated="{chat.updated_at:.0f}" '
        f'data-pinned="{str(chat.pinned).lower()}" data-writing="{str(writing).lower()}">'
        f'<button class="reame-open" data-reame-action="open:{chat.id}" title="{title}" '
        f'data-title="{title}"'
        f'{marked} tabindex="{0 if current else -1}">'
        f'<span class="reame-title">{title}</span>{shown}</button>'
        f'<details class="reame-menu"><summary aria-label="Options for {title}" '
        f'tabindex="{0 if current else -1}" title="Options">⋯</summary><div class="reame-menu-items" role="group">'
        f'<button data-reame-action="pin:{chat.id}">{pin}</button>'
        f'<button data-reame-action="rename:{chat.id}" data-title="{title}">Rename</button>'
        f'<button data-reame-action="archive:{chat.id}">{archive}</button>'
        f'<button data-reame-action="export:{chat.id}">Export (JSON)</button>'
        f'<button data-reame-action="markdown:{chat.id}">Export (Markdown)</button>'
        f'<button data-reame-action="delete:{chat.id}" data-title="{title}" '
        f'class="reame-danger">Delete</button>'
        f"</div></details></li>")


# The markup that holds a document in a stored message (documents.compose), whole or cut by
# the snippet's "…" at either end: the snippet shows the document's name and text instead.
_DOCUMENT_MARKUP = [
    (re.compile(r'<?\bdocument name="([^"\n]*)">\s*'), r"\1: "),  # an opening: its name
    (re.compile(r'^…[^\s…]*">\s*'), "…"),  # an opening's tail, cut at the start
    (re.compile(r"\s*<?/document>\s*"), " "),  # a closing
    (re.compile(r'\s*<[/a-z]*(?: name="[^"\n]*)?…$'), "…"),  # a tag's head, cut at the end
]


def plain_snippet(snippet: str) -> str:
    """A search snippet as words: without the markup around the documents in the message."""
    for pattern, replacement in _DOCUMENT_MARKUP:
        snippet = pattern.sub(replacement, snippet)
    return snippet.strip()


def _snippet_html(snippet: str) -> str:
    """A search snippet with its matches marked (MARK ... END_MARK), escaped."""
    escaped = html.escape(plain_snippet(snippet)).replace(MARK, "<mark>").replace(
        END_MARK, "</mark>")
    return f'<span class="reame-snippet">{escaped}</span>'


def listing_html(service: ChatService, user: str | None, chat_id: int | None,
                 words: str = "", writing: frozenset[int] = frozenset()) -> str:
    """The chat list's HTML: the user's chats, or those a search for words found; writing:
    the chats whose reply is being written."""
    if words.strip():
        return search_results_html(service.search(words, user), chat_id, words,
                                   writing=writing)
    return chat_list_html(service.list_chats(user, limit=SHOWN, archived=False), chat_id,
                          total=service.count_chats(user, archived=False), writing=writing,
                          archived=service.count_chats(user, archived=True))


def archived_listing_html(service: ChatService, user: str | None, chat_id: int | None,
                          writing: frozenset[int] = frozenset()) -> str:
    return archived_html(service.list_chats(user, archived=True), chat_id, writing=writing)


def latest_chat_id(service: ChatService, user: str | None) -> int | None:
    chat = service.latest_chat(user)
    return chat.id if chat is not None else None
