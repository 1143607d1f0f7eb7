"""The body of POST /v1/completions (OpenAI's legacy text completions) as a pydantic model,
checked as strictly as a chat request's (request_models.py): JSON's own types, a field that is
not OpenAI's refused by name, and each of OpenAI's parameters honoured or refused by name
unless it has its neutral value (UNSUPPORTED)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationError

from reame.chats.conversation import STATELESS_TEMPERATURE, STATELESS_TOP_P
from reame.config.chat_settings import FIELD
from reame.web.v1.errors import ApiError, body_refusal, check_model, refuse_unsupported
from reame.web.v1.parameters import EXPECTED as CHAT_EXPECTED
from reame.web.v1.parameters import llama_seed
from reame.web.v1.request_models import (
    MAX_STOP_CHARS,
    MAX_STOPS,
    NonEmpty,
    Penalty,
    Positive,
    Seed,
    StopString,
    StreamOptions,
    StrictBody,
    Temperature,
    TopP,
)

DEFAULT_MAX_TOKENS = 16  # OpenAI's for /v1/completions
MAX_LOGPROBS = 5  # OpenAI's limit for this API's logprobs (an integer here)

TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


@dataclass(frozen=True)
class TextRequest:
    model: str
    prompt: str | list[int]  # a text, or the model's token ids
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None  # None: none; else how many likeliest tokens per position
    echo: bool = False  # the prompt's text comes back before the completion's


class CompletionsBody(StrictBody):
    """The body of POST /v1/completions, as far as this server reads it. A null field means its
    default (some clients send every field)."""
    model: NonEmpty
    # One prompt: a text, or token ids (a list of one of either is the same prompt).
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: Positive | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    seed: Seed | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
                     Annotated[float, Field(ge=-100, le=100)]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool | None = None
    # Accepted, no effect on the reply: an identifier for the provider's own records.
    user: str | None = None
    # OpenAI's, refused unless neutral (UNSUPPORTED).
    suffix: Any = None
    n: Any = None
    best_of: Any = None


# OpenAI's parameters this server does not honour: the values that change nothing (accepted),
# and why any other value is refused. README's table says the same.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "suffix": ((None, ""), "inserting text before a suffix (fill in the middle) needs a "
               "model's own infill tokens; write the model's infill template into the prompt"),
    "n": ((None, 1), "one completion per request (send the request again for another)"),
    "best_of": ((None, 1), "one completion per request: there are no others to choose from"),
}


# What each field must be, by its path ("" is the body itself).
EXPECTED = {
    "": "a JSON object",
    "model": "a model id (a string); see GET /v1/models",
    "prompt": "a string, or an array of token ids (integers from 0), or an array of one of "
              "either",
    "max_tokens": "a positive integer",
    "temperature": f"a number {FIELD['temperature'].allowed()}",
    "top_p": f"a number {FIELD['top_p'].allowed()}",
    "stop": (f"a non-empty string of at most {MAX_STOP_CHARS} characters, or up to "
             f"{MAX_STOPS} of them"),
    "seed": "an integer of 64 bits",
    "logit_bias": CHAT_EXPECTED["logit_bias"],
    "stream": "true or false",
    "stream_options": 'an object, {"include_usage": true or false}',
    "stream_options.include_usage": "true or false",
    "frequency_penalty": "a number from -2 to 2",
    "presence_penalty": "a number from -2 to 2",
    "logprobs": f"an integer from 0 to {MAX_LOGPROBS} (how many likeliest tokens per position)",
    "echo": "true or false",
    "user": "a string",
}


def parse_completions(body: Any, model_ids: list[str]) -> TextRequest:
    """Validate a /v1/completions body; ApiError (400/404) says what is wrong."""
    try:
        request = CompletionsBody.model_validate(body)
    except ValidationError as exc:
        raise body_refusal(exc, EXPECTED, "completions") from None
    check_model(request.model, model_ids)
    refuse_unsupported(request, UNSUPPORTED)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "'stream_options' is only for streamed requests (stream: true)",
                       param="stream_options")
    if request.echo and request.logprobs is not None:
        raise ApiError(400, "'echo' with 'logprobs' is not supported by this server: the "
                       "prompt's own tokens' log-probabilities are not computed. It is refused "
                       "rather than ignored.", param="echo", code="unsupported_parameter")
    stop = request.stop or ()
    return TextRequest(
        request.model, _one_prompt(request.prompt),
        request.max_tokens or DEFAULT_MAX_TOKENS,
        STATELESS_TEMPERATURE if request.temperature is None else request.temperature,
        STATELESS_TOP_P if request.top_p is None else request.top_p,
        (stop,) if isinstance(stop, str) else tuple(stop), llama_seed(request.seed), request.stream,
        request.stream_options is not None and request.stream_options.include_usage,
        tuple((int(token), bias) for token, bias in (request.logit_bias or {}).items()),
        request.frequency_penalty or 0.0, request.presence_penalty or 0.0,
        request.logprobs, bool(request.echo))


def _one_prompt(prompt: str | list) -> str | list[int]:
    """The prompt: a text or token ids; an array of several prompts is refused (one
    completion per request)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return prompt
    if not prompt:
        raise ApiError(400, "'prompt' is an empty array: there is nothing to complete",
                       param="prompt")
    if len(prompt) != 1:
        raise ApiError(400, f"'prompt' holds {len(prompt)} prompts: this server completes one "
                       "prompt per request (send each in its own request). It is refused "
                       "rather than ignored.", param="prompt", code="unsupported_parameter")
    return prompt[0]
