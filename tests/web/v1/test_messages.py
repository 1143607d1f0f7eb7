"""Anthropic's Messages API (POST /v1/messages) on a real server with the official `anthropic`
SDK: a reply as the model gives it, a tool_use / tool_result round trip created and streamed
with the KV of the first turn reused, a request shaped as Claude Code sends it, count_tokens,
and errors in Anthropic's shape."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import pytest
from openai import OpenAI

from tests.conftest import Server, start_server
from tests.reference import assert_answers, model_answer

CAPITAL = "What is the capital city of France? Answer in one word."
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "required": ["city"], "properties": {
               "city": {"type": "string", "maxLength": 40}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
RESULT = '{"temperature_c": 18, "sky": "cloudy"}'
# The SDK no longer names temperature (Anthropic's newest models ignore it); Claude Code and
# older clients still send it, and it is honoured.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("messages"), model_path=model_path,
                          max_tokens=32)
    yield server
    server.stop()


def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url.rstrip("/"), api_key="unused",
                               max_retries=0, timeout=120)


def test_a_reply_as_the_model_gives_it_streamed_or_not(server):
    reply = client(server).messages.create(model="any-name", max_tokens=32, extra_body=GREEDY,
                                           messages=[{"role": "user", "content": CAPITAL}])
    expected = model_answer(CAPITAL, system_prompt="", max_tokens=32)
    assert reply.type == "message" and reply.role == "assistant"
    assert [b.type for b in reply.content] == ["text"]
    assert_answers(reply.content[0].text, expected)
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.output_tokens > 0
    prompt = reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    counted = client(server).messages.count_tokens(
        model="any-name", messages=[{"role": "user", "content": CAPITAL}])
    assert counted.input_tokens == prompt
    with client(server).messages.stream(model="any-name", max_tokens=32, extra_body=GREEDY,
                                        messages=[{"role": "user", "content": CAPITAL}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == reply.content[0].text == final.content[0].text
    assert final.usage.cache_read_input_tokens > 0, "the same prompt: its KV reused"


@pytest.mark.slow
def test_a_tool_use_and_its_result_reusing_the_first_turn_s_kv(server):
    sdk = client(server)
    called = sdk.messages.create(model="m", max_tokens=160, extra_body=GREEDY, tools=[WEATHER],
                                 tool_choice={"type": "any"}, messages=ASK)
    assert called.stop_reason == "tool_use"
    uses = [b for b in called.content if b.type == "tool_use"]
    use = uses[0]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    assert use.id.startswith("toolu_")
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                      for b in called.content]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": u.id, "content": RESULT}
                         for u in uses]}]
    with sdk.messages.stream(model="m", max_tokens=32, extra_body=GREEDY, tools=[WEATHER],
                             messages=history) as stream:
        answer = stream.get_final_message()
    # past the first prompt and through the calls (spliced in as the tokens the model wrote)
    assert answer.usage.cache_read_input_tokens > (called.usage.input_tokens
                                                   + called.usage.cache_read_input_tokens + 20)
    assert answer.usage.input_tokens < 40 * len(uses), "only the results and the reply's header"
    text = "".join(b.text for b in answer.content if b.type == "text")
    # The reference: the same conversation through chat completions (the same prompt).
    openai = OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=120)
    call = {"id": "call_1", "type": "function", "function": {
        "name": use.name, "arguments": json.dumps(use.input)}}
    same = openai.chat.completions.create(
        model=openai.models.list().data[0].id, extra_body=GREEDY, max_tokens=32,
        tools=[{"type": "function", "function": {"name": WEATHER["name"], "description":
                WEATHER["description"], "parameters": WEATHER["input_schema"]}}],
        messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {**call, "id": f"call_{n}", "function": {"name": u.name, "arguments": json.dumps(
                u.input)}} for n, u in enumerate(uses)]}] + [
            {"role": "tool", "tool_call_id": f"call_{n}", "content": RESULT}
            for n in range(len(uses))])
    if text:
        assert_answers(text, same.choices[0].message.content or "", n=2)
    streamed_call = sdk.messages.create(model="m", max_tokens=160, extra_body=GREEDY,
                                        tools=[WEATHER], tool_choice={"type": "tool",
                                                                      "name": "get_weather"},
                                        messages=ASK, stream=True)
    events = list(streamed_call)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert json.loads("".join(d.partial_json for d in deltas
                              if d.type == "input_json_delta")) == use.input
    assert next(e for e in events if e.type == "message_delta").delta.stop_reason == "tool_use"


def test_a_request_shaped_as_claude_code_sends_it(server):
    system = [{"type": "text", "text": "You are Claude Code, a coding agent.",
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]
    tools = [{**WEATHER, "cache_control": {"type": "ephemeral"}},
             {"name": "Bash", "description": "Run a command",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                               "required": ["command"], "additionalProperties": False,
                               "$schema": "http://json-schema.org/draft-07/schema#"}}]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}]}]
    with client(server).messages.stream(
            model="claude-sonnet-4-5", max_tokens=32, system=system, tools=tools,
            messages=messages, metadata={"user_id": "user_abc"}, extra_body={"temperature": 1},
            thinking={"type": "disabled"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert final.usage.output_tokens > 0


def post(server: Server, path: str, body: dict, headers: dict | None = None):
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("change, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]}, "messages[1]"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]}, "messages[0]"),
    ({"container": "c1"}, "container"),
])
def test_errors_come_in_anthropic_s_shape_naming_the_field(server, change, param):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
            **change}
    body = {k: v for k, v in body.items() if v is not None}
    status, answer = post(server, "v1/messages", body)
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert param.split("[")[0] in answer["error"]["message"], answer
    if "max_tokens" in body:  # the SDK itself asks for it
        with pytest.raises(anthropic.BadRequestError) as refused:
            client(server).messages.create(**{k: body[k] for k in ("model", "max_tokens")},
                                           messages=[{"role": "user", "content": "Hi"}],
                                           extra_body=change)
        assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_the_docs_table_names_every_field_the_server_reads():
    from reame.web.v1.messages_request import MessagesRequest

    from tests.conftest import ROOT

    table = (ROOT / "docs" / "api.md").read_text().split("| messages field | here |")[1]
    table = table.split("\n\n")[0]
    named = {name for row in table.splitlines() if row.startswith("|")
             for name in row.split("|")[1].split("`")[1::2]}
    assert set(MessagesRequest.model_fields) <= named, set(MessagesRequest.model_fields) - named


def test_a_stop_sequence_is_named_and_the_stream_starts_with_the_prompt_s_tokens(server):
    """A reply ended by one of the request's stop_sequences says so (stop_reason
    "stop_sequence", and which one), streamed or not; message_start's usage counts the prompt
    (input and cache-read tokens add up to count_tokens'), not 0."""
    sdk = client(server)
    ask = [{"role": "user", "content": "Name three colours of the rainbow, in one sentence."}]
    whole = sdk.messages.create(model="m", max_tokens=32, extra_body=GREEDY, messages=ask)
    words = whole.content[0].text.split()
    assert len(words) >= 4, whole.content[0].text
    stop = words[len(words) // 2]  # a word from the middle of the model's own reply
    before = whole.content[0].text[:whole.content[0].text.index(stop)].strip()
    cut = sdk.messages.create(model="m", max_tokens=32, extra_body=GREEDY, messages=ask,
                              stop_sequences=[stop, "never-in-this-reply"])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == before
    assert (whole.stop_reason, whole.stop_sequence) in (("end_turn", None), ("max_tokens", None))
    prompt = sdk.messages.count_tokens(model="m", messages=ask).input_tokens
    with sdk.messages.stream(model="m", max_tokens=32, extra_body=GREEDY, messages=ask,
                             stop_sequences=[stop]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start").message.usage
    assert start.input_tokens + start.cache_read_input_tokens == prompt
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == before
    with pytest.raises(anthropic.BadRequestError):  # a stop sequence is at most 256 characters
        sdk.messages.create(model="m", max_tokens=8, messages=ask, stop_sequences=["x" * 257])
