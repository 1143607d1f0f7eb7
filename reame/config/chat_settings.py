"""A chat's own settings: its system prompt and how its replies are sampled.

Declared once, here, with their ranges. reame.conf's [generation] section holds the defaults of
new chats (reame_conf.py builds its entries from FIELDS), the store keeps each chat's, the service
validates every change with ChatSettings.changed (with the pydantic model generated from FIELDS),
and both APIs and the page take their ranges from FIELD.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from reame.config.refusals import ChatError
from reame.config.setting import Setting, first_problem, settings_model


class SettingValueError(ChatError, ValueError):
    """A chat setting outside its range; the message says what is allowed."""


def json_number(setting: Setting) -> Callable[[Any], Any]:
    """A number as JSON sends it, for a setting of this kind: a whole number may come as 2.0.
    A whole number beyond any float raises OverflowError (import.read_settings words it)."""
    def convert(value: Any) -> Any:
        if (setting.kind in (int, float) and isinstance(value, (int, float))
                and not isinstance(value, bool)):
            whole = float(value).is_integer()
            return int(value) if setting.kind is int and whole else value
        return value
    return convert


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
        given = {name: value for name, value in changes.items() if value is not None}
        try:
            checked = settings_model("ChatSettings", FIELDS, json_number).model_validate(given)
        except ValidationError as exc:
            name, problem = first_problem(exc)
            setting = FIELD[name]
            expected = ("a text" if setting.kind is str else setting.allowed()
                        if problem == "range" else f"a number {setting.allowed()}")
            raise SettingValueError(f"{name} must be {expected}") from None
        return dataclasses.replace(self, **checked.model_dump(exclude_unset=True))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
