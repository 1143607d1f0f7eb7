"""Fuzzing the two APIs from their shapes (hypothesis), against a real server process: bodies
and arguments of every type and size, valid and not. Each answer is a clear refusal (a 4xx
with a message, or a Gradio error with one) or an answer, never a 500 or an internal error,
and the server serves normally afterwards.

The examples are derived from a fixed seed (derandomize): the same ones in every run, so a
failure here is a bug to fix, not noise. Values that cost model time (max_tokens) are kept
small so that the run stays bounded; their range checks are tested in test_openai/test_api.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reame.web.gradio_api.guarded import INTERNAL_ERROR as API_INTERNAL_ERROR
from reame.web.v1.common import INTERNAL_ERROR as V1_INTERNAL_ERROR

from tests.conftest import FULL, Server, start_server

FUZZ = settings(max_examples=200 if FULL else 40, deadline=None, derandomize=True,
                database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
TIMEOUT = 120  # s, one request on a busy machine
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("fuzz"), model_path=model_path, max_tokens=4)
    for n in range(3):
        assert call(server, "new_chat", [f"Chat {n + 1}", None]) == ("complete", [n + 1])
    yield server
    server.stop()


def http(url: str, body: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def still_serving(server: Server) -> None:
    status, _ = http(server.url + "v1/models")
    assert status == 200
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 2}
    status, text = http(server.url + "v1/chat/completions", json.dumps(body).encode())
    assert status == 200, text
    assert json.loads(text)["choices"][0]["message"]["role"] == "assistant"


# strategies

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                        max_leaves=10)
text = st.text(max_size=200)
user_text = st.text(min_size=1, max_size=100).filter(str.strip)
few_tokens = st.one_of(st.integers(-3, 4), st.floats(-2, 4), st.booleans(), st.text(max_size=4),
                       st.none())
number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5),
                   st.text(max_size=4), st.none())
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | anything},
                             optional={"text": text | anything})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | anything},
    optional={"content": text | st.lists(part, max_size=3) | anything, "name": anything,
              "tool_calls": anything, "tool_call_id": anything})
# Tools: names valid or not, schemas usual or any object (the grammar made from it may be
# refused, never a failed turn).
schema = st.sampled_from([
    {}, {"type": "object"}, {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0},
                                      "tags": {"type": "array", "items": {"type": "string"},
                                               "maxItems": 3}}},
    {"type": "object", "properties": {"x": {"type": "string", "maxLength": 10 ** 7}}},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/y"}},
     "$defs": {"y": {"enum": ["a", "b"]}}}]) | st.dictionaries(st.text(max_size=12), anything,
                                                             max_size=4)
tool_def = st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries(
         {"name": st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True) | st.text(max_size=8)},
         optional={"description": text, "parameters": schema, "strict": st.booleans()})})
tool_choice = (st.sampled_from(["none", "auto", "required"])
               | st.fixed_dictionaries({"type": st.just("function"), "function":
                                        st.fixed_dictionaries({"name": st.text(max_size=8)})}))
# A request that is valid: every field in its range, the last message the user's.
valid_completion = st.fixed_dictionaries(
    {"model": st.just(MODEL),
     "messages": st.tuples(
         st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]),
                                         "content": text}), max_size=1),
         st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                         "content": text}), max_size=3),
         st.fixed_dictionaries({"role": st.just("user"),
                                "content": user_text | st.lists(st.fixed_dictionaries(
                                    {"type": st.just("text"), "text": user_text}),
                                    min_size=1, max_size=2)}))
     .map(lambda m: [*m[0], *m[1], m[2]])},
    optional={"max_tokens": st.integers(1, 4), "temperature": st.floats(0, 2),
              "top_p": st.floats(0.01, 1), "seed": st.integers(0, 2**32 - 2),
              "stop": st.text(min_size=1, max_size=4) | st.lists(
                  st.text(min_size=1, max_size=4), max_size=4),
              "stream": st.booleans(),
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
              "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
              "user": st.text(max_size=8), "logprobs": st.just(False),
              "tools": st.just([]) | st.lists(tool_def, max_size=2),
              "tool_choice": tool_choice, "parallel_tool_calls": st.booleans(),
              "n": st.integers(1, 3),
              "response_format": st.just({"type": "text"})})
# ... with one field replaced by anything, or one more field of any name and value.
broken_completion = st.tuples(valid_completion, st.sampled_from(
    ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
     "seed", "stop", "stream", "stream_options", "n", "tools", "response_format",
     "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs", "tool_choice",
     "parallel_tool_calls", "functions", "function_call", "modalities", "audio", "prediction",
     "reasoning_effort", "verbosity", "web_search_options", "store", "metadata",
     "service_tier", "user", "safety_identifier", "prompt_cache_key"])
    | st.text(max_size=12), anything).map(lambda b: {**b[0], b[1]: b[2]})
# ... or with messages of any shape.
odd_messages = st.tuples(valid_completion, st.lists(message, max_size=5)).map(
    lambda b: {**b[0], "messages": b[1]})
completion = st.one_of(valid_completion, broken_completion, odd_messages, anything)


def _body(value) -> bytes:
    # json.dumps writes NaN and Infinity as Python's json.loads reads them: sent as such.
    return json.dumps(value).encode()


@pytest.mark.slow
@FUZZ
@given(body=completion, raw=st.none() | st.none() | st.binary(max_size=64))
def test_v1_answers_any_body_without_a_500(server, body, raw):
    status, text = http(server.url + "v1/chat/completions", raw if raw is not None else _body(body))
    event(f"HTTP {status}")  # how the examples spread (pytest --hypothesis-show-statistics)
    assert status < 500, (status, text[:500])
    if status != 200:
        error = json.loads(text)["error"]
        assert error["message"] and V1_INTERNAL_ERROR not in error["message"], error
    elif text.startswith(b"data:"):  # a stream: chunks, then [DONE]
        assert text.rstrip().endswith(b"data: [DONE]") and V1_INTERNAL_ERROR.encode() not in text
    else:
        assert json.loads(text)["choices"][0]["message"]["role"] == "assistant"


# Chats 1 to 3 exist when the fuzzing starts (made by the fixture); others come and go.
chat_id = st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(-1, 12), anything)
few = st.one_of(st.none(), st.integers(-3, 6), st.floats(allow_nan=True), st.text(max_size=4))
CALLS = {
    "new_chat": st.tuples(text | anything, st.none() | text | anything),
    "send": st.tuples(chat_id, text | anything),
    "regenerate": st.tuples(chat_id),
    "edit_message": st.tuples(chat_id, st.integers(-1, 30) | anything, text | anything),
    "list_chats": st.tuples(),
    "get_chat": st.tuples(chat_id),
    "rename_chat": st.tuples(chat_id, text | anything),
    "update_chat": st.tuples(chat_id, st.none() | text | anything, number, number, few),
    "delete_chat": st.tuples(st.integers(4, 12) | anything),  # chats 1 to 3 stay
    "type_ahead": st.tuples(chat_id, text | anything),
    "cache_stats": st.tuples(),
    "get_settings": st.tuples(),
    "list_models": st.tuples(),
}
# Each endpoint's own number of arguments, or more (Gradio ignores the extra ones). Fewer is
# refused by Gradio itself, before Reame's code, with an error event that has no message.
named_call = st.sampled_from(sorted(CALLS)).flatmap(
    lambda name: st.tuples(st.just(name), st.tuples(CALLS[name], st.lists(anything, max_size=2))
                           .map(lambda given: [*given[0], *given[1]])))


def call(server: Server, name: str, args: list) -> tuple[str, object]:
    """A call to the named API over HTTP: its last event and that event's data."""
    status, text = http(f"{server.url}gradio_api/call/{name}", _body({"data": args}))
    if status != 200:
        return f"HTTP {status}", text.decode(errors="replace")
    event_id = json.loads(text)["event_id"]
    status, stream = http(f"{server.url}gradio_api/call/{name}/{event_id}")
    assert status == 200, stream
    events = [block for block in stream.decode().split("\n\n") if block.strip()]
    last = dict(line.split(": ", 1) for line in events[-1].splitlines() if ": " in line)
    return last.get("event", ""), json.loads(last["data"]) if "data" in last else None


@FUZZ
@given(named=named_call)
def test_the_named_api_answers_any_arguments_with_an_answer_or_a_clear_error(server, named):
    name, args = named
    outcome, data = call(server, name, args)
    event(f"/{name}: {outcome}")
    if outcome == "error":  # {"error": "the message", ...}; null when there is none
        message = data.get("error") if isinstance(data, dict) else None
        assert isinstance(message, str) and message and API_INTERNAL_ERROR not in message, (
            name, args, data)
    else:
        assert outcome == "complete" or outcome.startswith("HTTP 4"), (name, args, outcome,
                                                                        data)


@pytest.mark.parametrize("value", ["--5", "\u00b2", "1e3", "9" * 5000, 2**70, True, 2.5])
def test_a_chat_id_that_is_no_whole_number_is_refused_by_name(server, value):
    outcome, data = call(server, "get_chat", [value])
    assert outcome == "error" and data["error"] == "chat_id must be a whole number", data


def test_the_server_serves_after_the_fuzzing_and_logged_no_internal_error(server):
    still_serving(server)
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 500:][:3000]

