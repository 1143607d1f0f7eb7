"""JSON that parses but is not text Reame can keep: strings holding a lone surrogate.

JSON may say "\\ud800" (half of a UTF-16 pair, alone); Python reads it into a str that no UTF-8
encoder, tokenizer or database driver takes, so it failed deep inside (a 500, an "internal
error"). The HTTP layer and imports ask `lone_surrogate` first and refuse with the place named.
"""

from __future__ import annotations

import re

# A \\uD800-\\uDFFF escape somewhere in the raw bytes: the only way JSON text holds a surrogate
# (UTF-8 cannot encode one). Valid pairs match too, and are then found to be fine.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def is_text(value: str) -> bool:
    """Whether value can be written as UTF-8 (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate(value: object) -> str | None:
    """Where the first string (a value or a key) holding a lone surrogate is in value, as a
    path ("messages[0].content"), or None. Iterative: any depth."""
    todo: list[tuple[object, str]] = [(value, "")]
    while todo:
        item, path = todo.pop()
        if isinstance(item, str):
            if not is_text(item):
                return path or "the body"
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                where = f"{path}.{key}" if path else str(key)
                if not is_text(key):
                    return f"a key in {path or 'the body'}"
                todo.append((inner, where))
        elif isinstance(item, list):
            todo.extend((inner, f"{path}[{n}]") for n, inner in reversed(list(enumerate(item))))
    return None
