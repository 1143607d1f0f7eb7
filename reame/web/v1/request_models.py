"""The body of POST /v1/chat/completions as pydantic models: every parameter of OpenAI's chat
completions, strict as JSON means its types, a field that is not OpenAI's refused by name
(parameters.py says what each must be, chat_request.py reads a body into a CompletionRequest).
The shared pieces (StrictBody, the number types, StreamOptions) are /v1/completions' too
(completions_request.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reame.config.chat_settings import FIELD
from reame.config.setting import field_type

MAX_STOPS = 4
# A stop string's characters: a reply's text is checked against each stop at every token, and
# a tail that may begin one is held back (decoding.py), at a cost that grows with its length.
MAX_STOP_CHARS = 256
MAX_CHOICES = 16  # n: also at most the server's slots (chat_completions.py)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_MESSAGES = 2048  # messages in one request (each costs a template render and a lookup)
MAX_TOOLS = 128  # OpenAI's limit
MAX_TOOL_CALLS = 128  # calls in one assistant message


class StrictBody(BaseModel):
    """Strict, as JSON means its types: true is not 1 and "5" is not 5; a field that is not
    OpenAI's is refused by name."""
    model_config = ConfigDict(strict=True, extra="forbid")


Role = Literal["system", "developer", "user", "assistant", "tool"]
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Positive = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Seed = Annotated[int, Field(ge=-2**63, le=2**64 - 1)]  # any 64-bit integer (OpenAI's int64)


# A chat setting's type with its range, as its declaration gives it (chat_settings.FIELD).
Temperature = field_type(FIELD["temperature"])
TopP = field_type(FIELD["top_p"])
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


class TextPart(StrictBody):
    type: Literal["text"]
    text: str


class CalledFunction(StrictBody):
    name: FunctionName
    arguments: str  # JSON text of an object, as the reply wrote it


class CallIn(StrictBody):
    id: NonEmpty
    type: Literal["function"]
    function: CalledFunction


class Message(StrictBody):
    role: Role
    content: str | list[TextPart] | None = None  # None only beside an assistant's tool_calls
    tool_calls: Annotated[list[CallIn], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: NonEmpty | None = None  # a tool message's: the call it answers
    # OpenAI's, refused when set (chat_request.py): no template here has a place for them.
    name: Any = None
    refusal: Any = None
    audio: Any = None


class FunctionDef(StrictBody):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None  # the arguments always follow the schema here (a grammar)


class ToolDef(StrictBody):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(StrictBody):
    name: FunctionName


class NamedChoice(StrictBody):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(StrictBody):
    include_usage: bool = False


class ChatRequest(StrictBody):
    """The body of POST /v1/chat/completions, as far as this server reads it. A null sampling
    field means its default (some clients send every field)."""
    model: NonEmpty
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: Positive | None = None
    max_completion_tokens: Positive | None = None  # max_tokens' newer name
    temperature: Temperature | None = None
    top_p: TopP | None = None
    # An empty stop string would end every reply before its first word.
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    seed: Seed | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
                     Annotated[float, Field(ge=-100, le=100)]] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # Accepted, no effect on the reply: identifiers for the provider's own records (Reame
    # keeps none) and a hint for its prompt cache (Reame's finds the prompt by its tokens).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: Any = None  # checked by chat_request.response_grammar()
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's, refused unless neutral (parameters.UNSUPPORTED).
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
