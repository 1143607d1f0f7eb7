"""One setting's declaration: where it lives in reame.conf, its type, default, range and help.

reame.conf's settings (config.SETTINGS) and a chat's own settings (chat_settings.FIELDS) are
declared with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    low_open: bool = False  # the minimum itself is not allowed

    def in_range(self, value: float) -> bool:
        low, high = self.minimum, self.maximum
        return not ((low is not None and (value < low or self.low_open and value == low))
                    or (high is not None and value > high))

    def allowed(self) -> str:
        """The range in words, e.g. "between 0 and 2" or "above 0 and at most 1"."""
        if self.low_open:
            return f"above {self.minimum:g} and at most {self.maximum:g}"
        return f"between {self.minimum:g} and {self.maximum:g}"
