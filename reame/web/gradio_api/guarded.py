"""What every named endpoint gets before gr.api registers it (guarded): its arguments checked
by a pydantic model made from its annotations, so that a client's JSON of the wrong kind is a
refusal that says what the argument must be; and an unexpected exception logged, the client
told only INTERNAL_ERROR. A gr.Error (an unknown chat, a refusal) passes as it is."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Annotated, Any

import gradio as gr
from pydantic import BeforeValidator, ValidationError, create_model

from reame.config.setting import STRICT, WHOLE_NUMBER, first_problem

log = logging.getLogger(__name__)

INTERNAL_ERROR = ("Internal error: the server could not do this. The details are in its log; "
                  "your chats are unchanged.")


def user_error(exc: Exception) -> gr.Error:
    return gr.Error(str(exc), print_exception=False)


def _text_number(value: Any) -> Any:
    """A whole number as a client may send it also as a text int() reads ("12")."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


# An endpoint's parameter annotations -> its pydantic type (strict: true is no number, "0.7" no
# float) and the words for what it must be.
KINDS: dict[str, tuple[Any, str]] = {
    "int": (Annotated[WHOLE_NUMBER, BeforeValidator(_text_number)], "a whole number"),
    "float": (float, "a number"),
    "str": (str, "a text"),
    "dict": (dict, "an object"),
}


def _checked(fn: Callable) -> Callable:
    """fn with its arguments checked first, by a pydantic model made from its annotations
    (KINDS): a client can send any JSON, and int([]) is not a refusal. A gr.Error says what the
    first wrong argument must be."""
    signature = inspect.signature(fn)
    fields, words = {}, {}
    for name, parameter in signature.parameters.items():
        annotation = str(parameter.annotation)
        kind, optional = annotation.removesuffix("| None").strip(), annotation.endswith("| None")
        if kind in KINDS:
            kind_type, words[name] = KINDS[kind]
            fields[name] = (kind_type | None if optional else kind_type, None)
            words[name] += " or null" if optional else ""
    arguments = create_model(f"{fn.__name__}_arguments", __config__=STRICT, **fields)

    def check(args, kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        given = {name: value for name, value in bound.arguments.items() if name in fields}
        try:
            valid = arguments.model_validate(given)
        except ValidationError as exc:
            name, _ = first_problem(exc)
            raise gr.Error(f"{name} must be {words[name]}", print_exception=False) from None
        bound.arguments.update({name: getattr(valid, name) for name in given})
        return bound.args, bound.kwargs

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args, **kwargs):
            args, kwargs = check(args, kwargs)
            async with aclosing(fn(*args, **kwargs)) as items:
                async for item in items:
                    yield item
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        args, kwargs = check(args, kwargs)
        return fn(*args, **kwargs)
    return call


def guarded(fn: Callable) -> Callable:
    """fn for gr.api: its arguments checked (_checked); an unexpected exception is logged with
    its traceback, and the client gets INTERNAL_ERROR instead of the exception's text (SQL,
    paths, ...). gr.Error (what a caller can act on: an unknown chat, a refusal) passes."""

    def internal(exc: Exception) -> gr.Error:
        log.error("/%s failed", fn.__name__, exc_info=exc)
        return gr.Error(INTERNAL_ERROR, print_exception=False)

    checked = _checked(fn)
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args, **kwargs):
            try:
                async with aclosing(checked(*args, **kwargs)) as items:
                    async for item in items:
                        yield item
            except gr.Error:
                raise
            except Exception as exc:
                raise internal(exc) from None
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return checked(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            raise internal(exc) from None
    return call
