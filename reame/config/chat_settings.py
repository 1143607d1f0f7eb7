"""A chat's own settings: its system prompt and how its replies are sampled.

Declared once, here, with their ranges. reame.conf's [generation] section holds the defaults of
new chats (reame_conf.py builds its entries from FIELDS), the store keeps each chat's, the service
validates every change with ChatSettings.changed, and both APIs and the page take their ranges
from FIELD.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from reame.config.refusals import ChatError
from reame.config.setting import Setting


class SettingValueError(ChatError, ValueError):
    """A chat setting outside its range; the message says what is allowed."""


def check(setting: Setting, value: Any) -> Any:
    """value as a chat setting of this kind, or SettingValueError saying what is allowed."""
    name = setting.key
    if setting.kind is str:
        if not isinstance(value, str):
            raise SettingValueError(f"{name} must be a text")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            not math.isfinite(value)) or (setting.kind is int and not float(value).is_integer()):
        raise SettingValueError(f"{name} must be a number {setting.allowed()}")
    value = setting.kind(value)
    if not setting.in_range(value):
        raise SettingValueError(f"{name} must be {setting.allowed()}")
    return value


# In reame.conf's [generation] section: the defaults of new chats.
FIELDS: tuple[Setting, ...] = (
    Setting("generation", "system_prompt", str, "You are a helpful assistant.",
            "system prompt of new chats"),
    Setting("generation", "temperature", float, 0.7, "sampling temperature; 0 = greedy",
            0.0, 2.0),
    Setting("generation", "top_p", float, 0.95, "nucleus sampling threshold", 0.0, 1.0,
            low_open=True),
    Setting("generation", "max_tokens", int, 512, "longest reply in tokens", 1, 32768),
)
FIELD = {f.key: f for f in FIELDS}


@dataclass(frozen=True)
class ChatSettings:
    system_prompt: str = FIELD["system_prompt"].default
    temperature: float = FIELD["temperature"].default
    top_p: float = FIELD["top_p"].default
    max_tokens: int = FIELD["max_tokens"].default

    @classmethod
    def of(cls, source: Any) -> "ChatSettings":
        """The settings of anything that has them as attributes (a stored chat)."""
        return cls(**{f.key: getattr(source, f.key) for f in FIELDS})

    def changed(self, **changes: Any) -> "ChatSettings":
        """These settings with changes applied, each checked (None keeps the current value)."""
        unknown = set(changes) - set(FIELD)
        if unknown:
            raise SettingValueError(f"no chat setting named {', '.join(sorted(unknown))}")
        checked = {name: check(FIELD[name], value) for name, value in changes.items()
                   if value is not None}
        return dataclasses.replace(self, **checked)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
