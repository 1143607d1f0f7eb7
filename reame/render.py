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


def stats_line(stats: dict | TurnStats | None) -> str:
    if not stats:
        return ""
    if isinstance(stats, dict):
        known = set(TurnStats.__dataclass_fields__)
        stats = TurnStats(**{k: v for k, v in stats.items() if k in known})
    return f'\n\n<div class="reame-stats">{html.escape(stats.line())}</div>'


def to_chatbot(messages: list[Message]) -> list[dict]:
    """Messages in the Chatbot's format; each reply carries its stats line."""
    shown = []
    for m in messages:
        content = inert_html(m.content)
        if m.role == "assistant":
            content += stats_line(m.stats_dict)
        shown.append({"role": m.role, "content": content})
    return shown
