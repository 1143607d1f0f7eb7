"""The errors of /v1 in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, and a
request body's faults said in the API's words: the first field pydantic refused, by its path as
the client wrote it, and a parameter refused unless it has its neutral value. Every route's
refusal is an ApiError; the body models are in request_models.py, the table of what each
parameter must be in parameters.py (and completions_request.py for /v1/completions)."""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from reame.config.refusals import RETRY_LOADING_S


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type_, param, code)

    def response(self) -> JSONResponse:
        # A model load takes seconds: OpenAI's SDKs wait Retry-After and try again.
        retry = {"Retry-After": str(RETRY_LOADING_S)} if self.code == "model_loading" else None
        return error_response(self.status, self.message, type_=self.type, param=self.param,
                              code=self.code, headers=retry)


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


def check_model(model: str, model_ids: list[str]) -> None:
    """A 404 naming the models there are, unless model is one of them (every /v1 route that
    takes a model)."""
    if model not in model_ids:
        raise ApiError(404, f"The model '{model}' does not exist; this server has: "
                       f"{', '.join(model_ids) or 'none loaded'}", param="model",
                       code="model_not_found")


def refuse_unsupported(request: BaseModel,
                       unsupported: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    for param, (neutral, why) in unsupported.items():
        value = getattr(request, param)
        if not any(value == ok and type(value) is type(ok) for ok in neutral):
            raise ApiError(400, f"'{param}' is not supported by this server: {why}. It is "
                           "refused rather than ignored.", param=param,
                           code="unsupported_parameter")


def body_refusal(exc: ValidationError, expected: dict[str, str], api: str) -> ApiError:
    """The first of pydantic's errors in this API's words: the field's path as the client wrote
    it ("messages[2].role") and what it must be. Pydantic's own text names its internals (class
    names, a union's branches)."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    if error["type"] == "extra_forbidden":
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                        for part in error["loc"]).lstrip(".")
        return ApiError(400, f"'{where}' is not a parameter of OpenAI's {api}: it "
                        "is refused rather than ignored", param=where,
                        code="unknown_parameter")
    param = ""
    for part in error["loc"]:  # down to the deepest field: not into a union's branches
        longer = f"{param}[{part}]" if isinstance(part, int) else f"{param}.{part}".lstrip(".")
        if _key(longer) not in expected:  # e.g. "stop.list[constrained-str]"
            break
        param = longer
    name, wanted = f"'{param}'" if param else "the request body", expected[_key(param)]
    verb = "is required:" if error["type"] == "missing" else "must be"
    return ApiError(400, f"{name} {verb} {wanted}", param=param or None)


def _key(param: str) -> str:
    return re.sub(r"\[\d+\]", "[]", param)  # messages[2].role -> messages[].role
