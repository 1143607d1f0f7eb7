"""Chat messages -> what the page shows: markdown with HTML made inert, and the stats line."""

from __future__ import annotations

import html
import re

from .chat import TurnStats
from .store import Message

# Fenced code blocks and inline code spans: markdown shows their content literally already.
_CODE = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]+`)", re.DOTALL)


def inert_html(text: str) -> str:
    """Escape HTML outside code so that markdown renders but no tag ever reaches the page."""
    parts = _CODE.split(text)
    return "".join(
        part if n % 2 else html.escape(part, quote=False).replace("&gt;", ">")
        for n, part in enumerate(parts)
    )


def reply_markdown(text: str, stats: dict | TurnStats | None = None) -> str:
    """A reply as shown: HTML made inert, then its stats line (if any).

    A reply cut by max_tokens or by stop can end inside a code fence; close it first, or the
    fence swallows the stats line, which then shows as raw HTML in a code block.
    """
    shown = inert_html(text)
    unclosed = _CODE.findall(shown)
    if unclosed and unclosed[-1].startswith("```") and (
            len(unclosed[-1]) < 6 or not unclosed[-1].endswith("```")):
        shown += "\n```"
    return shown + stats_line(stats)


def stats_line(stats: dict | TurnStats | None) -> str:
    if not stats:
        return ""
    if isinstance(stats, dict):
        known = set(TurnStats.__dataclass_fields__)
        stats = TurnStats(**{k: v for k, v in stats.items() if k in known})
    return f'\n\n<div class="reame-stats">{html.escape(stats.line())}</div>'


WINDOW_MARKER = ('\n\n<div class="reame-window">⋯ earlier messages are outside the model\'s '
                 'memory ⋯</div>')


def to_chatbot(messages: list[Message], window_start: int = 0) -> list[dict]:
    """Messages in the Chatbot's format; each reply carries its stats line, and the last reply
    before the model's window (window_start, a message position) carries a quiet marker."""
    last_outside = max((n for n, m in enumerate(messages) if m.position < window_start),
                       default=None)
    shown = []
    for n, m in enumerate(messages):
        if m.role == "assistant":
            content = reply_markdown(m.content, m.stats_dict)
            if n == last_outside:
                content += WINDOW_MARKER
        else:
            content = inert_html(m.content)
        shown.append({"role": m.role, "content": content})
    return shown
