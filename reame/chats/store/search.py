"""Search: the chats whose title or messages hold every word, with a snippet of the newest
matching message; through FTS5 on SQLite, tsvector columns on PostgreSQL (the tables and
triggers they read are made by the migrations: alembic/versions/005_search_and_pins.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Result

from reame.chats.messages import END_MARK, MARK
from reame.chats.store.tables import Chat
# PostgreSQL's text search configuration, made by revision 005 (unaccent, then simple).
TS_CONFIG = "reame_search"


@dataclass
class Found:
    """A chat that a search found, with a snippet of a message that matched ("" if only its
    title did)."""

    chat: Chat
    snippet: str


def search_terms(words: str) -> list[str]:
    """The words searched for: runs of letters, digits and _, at most 16."""
    return re.findall(r"\w+", words)[:16]


def _match_query(terms: list[str]) -> str:
    """An FTS5 query for every term, the last as a prefix: each quoted, so that nothing a user
    types is taken as FTS5 syntax."""
    quoted = [f'"{term}"' for term in terms]
    return " ".join(quoted[:-1] + [quoted[-1] + "*"])


def _owned(owner: str | None) -> str:
    """The SQL condition on `c` (the chat) for the owner's chats."""
    return "c.owner = :owner" if owner is not None else "c.owner IS NULL"


def sqlite_matches(conn: Connection, owner: str | None, terms: list[str],
                    limit: int) -> dict[int, str]:
    """Chat id -> snippet of its newest matching message ("" if only its title matched), for
    at most limit chats of each kind, newest first: through the FTS5 tables."""
    query, owned = _match_query(terms), _owned(owner)
    titles = conn.execute(text(
        f"SELECT c.id FROM chat_fts JOIN chat AS c ON c.id = chat_fts.rowid "
        f"WHERE chat_fts MATCH :q AND {owned} ORDER BY chat_fts.rowid DESC "
        f"LIMIT :limit"), {"q": query, "owner": owner, "limit": limit})
    found = {row[0]: "" for row in titles}
    matches = conn.execute(text(
        f"SELECT message_fts.chat_id, snippet(message_fts, 0, :mark, :end, '…', 12) "
        f"FROM message_fts JOIN chat AS c ON c.id = message_fts.chat_id "
        f"WHERE message_fts MATCH :q AND {owned} ORDER BY message_fts.rowid DESC"),
        {"q": query, "owner": owner, "mark": MARK, "end": END_MARK})
    found.update(_first_of_each_chat(matches, limit))
    return found


def _first_of_each_chat(rows: Result, limit: int) -> dict[int, Any]:
    """Chat id -> the value of its first row, for the first limit chats: rows are (chat id,
    value), newest first; they are left (closed) as soon as limit chats are found."""
    first: dict[int, Any] = {}
    for chat_id, value in rows:
        if chat_id not in first:
            first[chat_id] = value
            if len(first) >= limit:
                break
    rows.close()
    return first


def _tsquery(terms: list[str]) -> str:
    """A PostgreSQL tsquery for every term, the last as a prefix: each quoted (terms are
    letters, digits and _ only: no quote to escape)."""
    quoted = [f"'{term}'" for term in terms]
    return " & ".join(quoted[:-1] + [quoted[-1] + ":*"])


# ts_headline's options: about FTS5's snippet (12 words around the first match).
_HEADLINE = (f'StartSel="{MARK}", StopSel="{END_MARK}", MaxWords=12, MinWords=6, '
             f'ShortWord=0, MaxFragments=1')


def postgres_matches(conn: Connection, owner: str | None, terms: list[str],
                      limit: int) -> dict[int, str]:
    """What sqlite_matches finds, through the tsvector columns. The messages are read newest
    first from a server-side cursor, left as soon as limit chats are found; snippets are made
    for those messages only."""
    query, owned = _tsquery(terms), _owned(owner)
    matching = f"search_vector @@ to_tsquery('{TS_CONFIG}', :q)"
    titles = conn.execute(text(
        f"SELECT c.id FROM chat AS c WHERE c.{matching} AND {owned} ORDER BY c.id DESC "
        f"LIMIT :limit"), {"q": query, "owner": owner, "limit": limit})
    found = {row[0]: "" for row in titles}
    matches = conn.execution_options(yield_per=256).execute(text(
        f"SELECT m.chat_id, m.id FROM message AS m JOIN chat AS c ON c.id = m.chat_id "
        f"WHERE m.{matching} AND {owned} ORDER BY m.id DESC"), {"q": query, "owner": owner})
    newest = _first_of_each_chat(matches, limit)  # chat id -> its newest matching message
    if newest:
        snippets = conn.execute(text(
            f"SELECT m.id, m.content, ts_headline('{TS_CONFIG}', m.content, "
            f"to_tsquery('{TS_CONFIG}', :q), :options) FROM message AS m "
            f"WHERE m.id = ANY(:ids)"), {"q": query, "options": _HEADLINE,
                                          "ids": list(newest.values())})
        by_message = {message_id: _with_ellipses(content, headline)
                      for message_id, content, headline in snippets}
        found.update((chat_id, by_message[message_id]) for chat_id, message_id in newest.items()
                     if message_id in by_message)  # (not its chat deleted meanwhile)
    return found


def _with_ellipses(content: str, headline: str) -> str:
    """headline (a passage of content, its matches marked) with "…" where content goes on
    before or after it, as FTS5's snippets have."""
    plain = headline.replace(MARK, "").replace(END_MARK, "")
    start = content.find(plain)
    if start < 0:
        return headline
    before = "…" if content[:start].strip() else ""
    after = "…" if content[start + len(plain):].strip() else ""
    return before + headline + after
