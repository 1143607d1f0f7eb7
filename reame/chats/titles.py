"""Chat titles: a new chat's, one made from the first message, and what a title may be."""

from __future__ import annotations

import re

from reame.chats.documents import split
from reame.config.refusals import ChatError

DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48  # characters of a title made from a message
MAX_TITLE = 200  # characters of a chat's title


# Markdown's marks that a title shows as words: a heading's or a quote's at a line's start,
# emphasis and code around words.
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_LINE_MARK = re.compile(r"^\s{0,3}(?:#{1,6}\s+|>\s*)", re.MULTILINE)
_AROUND = re.compile(r"(\*\*|__|`+)(?=\S)(.+?)(?<=\S)\1")


def title_from(text: str) -> str:
    """The first words of a message (after the documents attached to it; their names if it
    holds nothing else), cut at a word boundary: its first line if that is a heading, and
    Markdown's marks left out ("# Field Notes ## Summary" was a title)."""
    documents, typed = split(text)
    first = next((line for line in typed.splitlines() if line.strip()), "")
    heading = _HEADING.match(first)
    typed = heading.group(1) if heading else _LINE_MARK.sub("", typed)
    typed = _AROUND.sub(r"\2", typed)
    return shortened(" ".join(typed.split()) or ", ".join(d.name for d in documents))


def shortened(line: str) -> str:
    """A line of at most TITLE_LENGTH characters: cut at a word boundary (in its second half,
    if it has one there) and marked with "…"."""
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    if " " in cut[TITLE_LENGTH // 2:]:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:.") + "…"


def checked_title(title: str) -> str:
    """title with its spaces tidied; ChatError if it is too long."""
    title = " ".join(title.split())
    if len(title) > MAX_TITLE:
        raise ChatError(f"a chat title has at most {MAX_TITLE} characters")
    return title
