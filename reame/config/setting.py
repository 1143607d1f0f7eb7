"""One setting's declaration: where it lives in reame.conf, its type, default, range and help.

reame.conf's settings (config.SETTINGS) and a chat's own settings (chat_settings.FIELDS) are
declared with it, and their checks are generated from it: settings_model makes a pydantic model
of a group of settings (the library /v1 already validates with), first_problem puts what it
refuses in this project's words.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model


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

    def allowed(self) -> str:
        """The range in words, e.g. "between 0 and 2" or "above 0 and at most 1"."""
        if self.low_open:
            return f"above {self.minimum:g} and at most {self.maximum:g}"
        return f"between {self.minimum:g} and {self.maximum:g}"


def field_type(setting: Setting) -> Any:
    """The setting's type for pydantic: its kind (its choices as a Literal) and its range as
    Field's ge or gt (low_open) and le."""
    kind = Literal[setting.choices] if setting.choices else setting.kind
    bounds = {"gt" if setting.low_open else "ge": setting.minimum, "le": setting.maximum}
    bounds = {name: bound for name, bound in bounds.items() if bound is not None}
    return Annotated[kind, Field(**bounds)] if bounds else kind


# Strict, as JSON means its types: true is not 1, "5" is not 5; a number is finite.
STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# A whole number in 64 bits, as JSON may write it: 12 or 12.0 (with STRICT, not "12" or true).
WHOLE_NUMBER = Annotated[int, BeforeValidator(_whole), Field(gt=-2**63, lt=2**63)]


@functools.cache
def settings_model(name: str, settings: tuple[Setting, ...],
                   before: Callable[[Setting], Callable[[Any], Any]] | None = None
                   ) -> type[BaseModel]:
    """A pydantic model with a field per setting: its type and range (field_type), default and
    help. before(setting), if given, converts a value before it is checked. Cached: one model
    per declaration."""
    fields: dict[str, Any] = {}
    for setting in settings:
        kind = field_type(setting)
        if before is not None:
            kind = Annotated[kind, BeforeValidator(before(setting))]
        fields[setting.key] = (kind, Field(setting.default, description=setting.help))
    return create_model(name, __config__=STRICT, **fields)


RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def first_problem(exc: ValidationError) -> tuple[str, str]:
    """What pydantic refused first, as (field, problem): "range" (out of its range) or "type"
    (not of its kind or choices). Pydantic's own messages name its internals (class names,
    "Input should be"): the callers say it in their words."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    return field, "range" if error["type"] in RANGE_ERRORS else "type"
