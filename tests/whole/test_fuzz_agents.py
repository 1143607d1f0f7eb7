"""Fuzzing the agents' APIs (/v1/messages, /v1/responses) from their shapes against a real
server process: every answer is a clear refusal in the API's error shape or an answer, never a
500, and the server logs no internal error. Derandomized (the same examples every run);
max_tokens kept small."""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from reame.web.v1.common import INTERNAL_ERROR

from tests.conftest import Server, start_server
from tests.whole.test_fuzz import FUZZ, MODEL, _body, anything, http, text, user_text

small = st.integers(1, 4) | st.integers(-2, 8) | anything
schema = st.just({"type": "object", "properties": {"city": {"type": "string"}}}) | anything
block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text | anything},
                          optional={"cache_control": anything}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.sampled_from(["t1", ""]),
                           "name": st.sampled_from(["f", "get_weather", "bad name"]),
                           "input": st.dictionaries(st.text(max_size=5), anything, max_size=2)
                           | anything}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.sampled_from(
        ["t1", "t2"]), "content": text | st.lists(anything, max_size=2)}),
    anything)
turn = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]) | anything,
                              "content": user_text | st.lists(block, max_size=3) | anything})
tool = st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f", "x y"]),
                              "input_schema": schema},
                             optional={"description": text, "type": anything})
messages_body = st.fixed_dictionaries(
    {"model": st.just("m") | anything, "max_tokens": small,
     "messages": st.lists(turn, min_size=1, max_size=4) | anything},
    optional={"system": text | st.lists(block, max_size=2) | anything,
              "tools": st.lists(tool, max_size=2) | anything,
              "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(
                  ["auto", "any", "tool", "none", "x"])}, optional={"name": st.just("f")})
              | anything,
              "stream": st.booleans() | anything, "stop_sequences": anything,
              "temperature": anything, "top_k": anything, "metadata": anything,
              "output_config": anything})
item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                           "content": user_text | anything}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.just("c1"),
                           "name": st.just("f"), "arguments": st.just("{}") | text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.just("c1"),
                           "output": text | anything}),
    anything)
responses_body = st.fixed_dictionaries(
    {"model": st.just(MODEL) | anything, "max_output_tokens": small},
    optional={"input": user_text | st.lists(item, max_size=3) | anything,
              "instructions": text | anything,
              "previous_response_id": st.just("resp_0") | anything,
              "tools": st.lists(st.fixed_dictionaries({
                  "type": st.just("function"), "name": st.just("f"), "parameters": schema}),
                  max_size=2) | anything,
              "tool_choice": st.sampled_from(["auto", "none", "required"]) | anything,
              "text": st.fixed_dictionaries({"format": st.fixed_dictionaries(
                  {"type": st.sampled_from(["text", "json_object", "json_schema"])},
                  optional={"schema": schema, "name": st.just("x")})}) | anything,
              "stream": st.booleans() | anything, "store": st.booleans() | anything})


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("fuzz_agents"), model_path=model_path,
                          max_tokens=4)
    yield server
    server.stop()


@FUZZ
@given(body=messages_body)
def test_messages_answer_any_body_without_a_500(server, body):
    status, answer = http(server.url + "v1/messages", _body(body))
    event(f"HTTP {status}")
    assert status < 500, (status, answer[:500])
    assert INTERNAL_ERROR.encode() not in answer
    if status != 200:
        error = json.loads(answer)
        assert error["type"] == "error" and error["error"]["message"], error
    elif not answer.startswith(b"event:"):
        assert json.loads(answer)["type"] == "message"


@FUZZ
@given(body=responses_body)
def test_responses_answer_any_body_without_a_500(server, body):
    status, answer = http(server.url + "v1/responses", _body(body))
    event(f"HTTP {status}")
    assert status < 500, (status, answer[:500])
    assert INTERNAL_ERROR.encode() not in answer
    if status != 200:
        assert json.loads(answer)["error"]["message"]
    elif not answer.startswith(b"event:"):
        assert json.loads(answer)["object"] == "response"


def test_the_server_logged_no_internal_error(server):
    log = server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
