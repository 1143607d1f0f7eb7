"""The table of /v1/chat/completions' parameters: those of OpenAI's this server does not honour
(each accepted at its neutral value, refused with its reason otherwise), what each field must
be (the words of a 400), and the message fields refused when set. docs/api.md's table says the
same."""

from __future__ import annotations

from typing import Any, get_args

from reame.config.chat_settings import FIELD
from reame.config.refusals import MAX_SEED
from reame.web.v1.request_models import (
    MAX_CHOICES,
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    Role,
)

# OpenAI's parameters this server does not honour: the values that change nothing (accepted),
# and why any other value is refused. docs/api.md's table is made from the same words.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": ((None, []), "function calling is deprecated by OpenAI: send 'tools'"),
    "function_call": ((None, "none", "auto"),
                      "function calling is deprecated by OpenAI: send 'tool_choice'"),
    "modalities": ((None, ["text"]), "the models here write text only"),
    "audio": ((None,), "the models here write text only"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "the models here have no reasoning setting"),
    "verbosity": ((None,), "the models here have no verbosity setting"),
    "web_search_options": ((None,), "this server does not search the web"),
    "store": ((None, False), "this server does not store completions made through /v1 (a "
              "stored chat is sent with the X-Reame-Chat header)"),
    "metadata": ((None, {}), "it tags stored completions, which this server does not keep"),
    "service_tier": ((None, "auto", "default"), "this server has one tier"),
}


# What each field must be, by its path with list indices as [] ("" is the body itself).
EXPECTED = {
    "": "a JSON object",
    "model": "a model id (a string); see GET /v1/models",
    "messages": f"a non-empty array of at most {MAX_MESSAGES:,} messages",
    "messages[]": "an object with a role and content",
    "messages[].role": f"one of {', '.join(get_args(Role))}",
    "messages[].content": 'a string or an array of text parts, {"type": "text", "text": ...}',
    "messages[].tool_calls": f"an array of at most {MAX_TOOL_CALLS} tool calls",
    "messages[].tool_calls[]": 'a tool call, {"id", "type": "function", "function": {"name", '
                               '"arguments"}}',
    "messages[].tool_calls[].id": "a non-empty string",
    "messages[].tool_calls[].type": '"function"',
    "messages[].tool_calls[].function": 'an object, {"name", "arguments"}',
    "messages[].tool_calls[].function.name": "a function name (letters, digits, _ and -, at "
                                             "most 64)",
    "messages[].tool_calls[].function.arguments": "a string (the arguments' JSON)",
    "messages[].tool_call_id": "a non-empty string (the id of the call this answers)",
    "tools": f"an array of at most {MAX_TOOLS} tools",
    "tools[]": 'a tool, {"type": "function", "function": {"name", "description", '
               '"parameters", "strict"}}',
    "tools[].type": '"function"',
    "tools[].function": 'an object, {"name", "description", "parameters", "strict"}',
    "tools[].function.name": "a function name (letters, digits, _ and -, at most 64)",
    "tools[].function.description": "a string",
    "tools[].function.parameters": "an object (a JSON schema)",
    "tools[].function.strict": "true or false",
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name"}}',
    "parallel_tool_calls": "true or false",
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "temperature": f"a number {FIELD['temperature'].allowed()}",
    "top_p": f"a number {FIELD['top_p'].allowed()}",
    "stop": (f"a non-empty string of at most {MAX_STOP_CHARS} characters, or up to "
             f"{MAX_STOPS} of them"),
    "seed": "an integer of 64 bits",
    "logit_bias": "an object of token ids (strings of digits) to numbers from -100 to 100",
    "n": f"an integer from 1 to {MAX_CHOICES}",
    "stream": "true or false",
    "stream_options": 'an object, {"include_usage": true or false}',
    "stream_options.include_usage": "true or false",
    "frequency_penalty": "a number from -2 to 2",
    "presence_penalty": "a number from -2 to 2",
    "user": "a string",
    "safety_identifier": "a string",
    "prompt_cache_key": "a string",
    "logprobs": "true or false",
    "top_logprobs": f"an integer from 0 to {MAX_TOP_LOGPROBS}",
}


MESSAGE_FIELDS = {
    "name": "the chat templates here have no place for a participant's name",
    "refusal": "a refusal is an OpenAI model's own field",
    "audio": "the models here write text only",
}


def llama_seed(seed: int | None) -> int | None:
    """OpenAI's seed, any 64-bit integer, as one of llama.cpp's (0 to MAX_SEED; 2**32 - 1 means
    "random" there): a seed in that range is itself, any other maps to one, always the same."""
    return None if seed is None else seed % (MAX_SEED + 1)
