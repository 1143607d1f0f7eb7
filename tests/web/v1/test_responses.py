"""OpenAI's Responses API (POST /v1/responses) on a real server with the official `openai` SDK:
a reply as the model gives it, a chain along previous_response_id with a function tool round
trip (streamed and not) whose later turns evaluate only their new input, also after a restart,
GET and DELETE, `responses.parse` with a schema, and refusals by name."""

from __future__ import annotations

import json

import pytest
from openai import BadRequestError, NotFoundError, OpenAI
from pydantic import BaseModel

from tests.conftest import Server, start_server
from tests.reference import assert_answers, model_answer

CAPITAL = "What is the capital city of France? Answer in one word."
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a "
           "city", "parameters": {"type": "object", "required": ["city"], "properties": {
               "city": {"type": "string", "maxLength": 40}}}}
ASK = "What is the weather like in Paris right now?"
RESULT = '{"temperature_c": 18, "sky": "cloudy"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("responses"), model_path=model_path,
                          max_tokens=32)
    yield server
    server.stop()


def sdk(server: Server) -> OpenAI:
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=120)


def model_of(server: Server) -> str:
    return sdk(server).models.list().data[0].id


@pytest.mark.slow
def test_a_reply_as_the_model_gives_it_with_instructions(server):
    client, model = sdk(server), model_of(server)
    reply = client.responses.create(model=model, input=CAPITAL, temperature=0)
    assert reply.status == "completed" and reply.object == "response"
    assert_answers(reply.output_text, model_answer(CAPITAL, system_prompt="", max_tokens=32))
    assert reply.usage.input_tokens > 10 and reply.usage.output_tokens > 0
    poet = "You are a poet. Answer in verse."
    verse = client.responses.create(model=model, input=CAPITAL, instructions=poet,
                                    temperature=0)
    assert_answers(verse.output_text, model_answer(CAPITAL, system_prompt=poet, max_tokens=32))
    cut = client.responses.create(model=model, input=CAPITAL, max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def streamed(stream) -> tuple[str, object, list[str]]:
    """A stream's text from its deltas, its final response, the events' types in order."""
    text, final, kinds = "", None, []
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    return text, final, kinds


@pytest.mark.slow
def test_a_chain_along_previous_response_id_evaluates_only_its_new_input(server):
    client, model = sdk(server), model_of(server)
    first = client.responses.create(model=model, input=ASK, tools=[WEATHER],
                                    tool_choice="required", temperature=0,
                                    max_output_tokens=160)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": RESULT}
               for c in calls]
    text, second, kinds = streamed(client.responses.create(
        model=model, previous_response_id=first.id, input=results, tools=[WEATHER],
        tool_choice="none", temperature=0, max_output_tokens=32, stream=True))
    assert "response.output_text.delta" in kinds and kinds[-1] in (
        "response.completed", "response.incomplete")
    assert text == second.output_text and text.strip()
    # past the first prompt and through the calls the model wrote (spliced in as its tokens)
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens + 20
    assert (second.usage.input_tokens - second.usage.input_tokens_details.cached_tokens
            < 40 * len(calls)), "only the results and the reply's header"
    # The reference: the same conversation sent whole through chat completions.
    same = client.chat.completions.create(
        model=model, temperature=0, max_tokens=32, tool_choice="none",
        tools=[{"type": "function", "function": {k: WEATHER[k] for k in (
            "name", "description", "parameters")}}],
        messages=[{"role": "user", "content": ASK},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": c.call_id, "type": "function", "function": {
                          "name": c.name, "arguments": c.arguments}} for c in calls]}]
        + [{"role": "tool", "tool_call_id": c.call_id, "content": RESULT} for c in calls])
    assert_answers(text, same.choices[0].message.content, n=2)

    third = client.responses.create(model=model, previous_response_id=second.id,
                                    input="Thank you. Is it cold?", tools=[WEATHER],
                                    tool_choice="none", temperature=0)
    assert third.previous_response_id == second.id
    cached = third.usage.input_tokens_details.cached_tokens
    assert cached > second.usage.input_tokens + 5, "the second turn's reply reused too"
    assert third.usage.input_tokens - cached < 25, "only its new input"

    server.restart()  # the chain is in the database, the KV in its files
    client = sdk(server)
    fourth = client.responses.create(model=model, previous_response_id=third.id,
                                     input="And tomorrow?", tools=[WEATHER],
                                     tool_choice="none", temperature=0)
    assert fourth.usage.input_tokens - fourth.usage.input_tokens_details.cached_tokens < 25
    assert client.responses.retrieve(first.id).output[0].type == "function_call"
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.call_id) for i in listed] == [
        ("function_call_output", c.call_id) for c in calls]
    asked = client.responses.input_items.list(first.id).data
    assert [(i.type, i.role, i.content[0].text) for i in asked] == [("message", "user", ASK)]
    client.responses.delete(fourth.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(fourth.id)
    with pytest.raises(BadRequestError) as refused:
        client.responses.create(model=model, previous_response_id=fourth.id, input="Hi")
    assert refused.value.body["param"] == "previous_response_id"


class City(BaseModel):
    name: str
    country: str


def test_parse_with_a_schema_and_a_response_not_stored(server):
    client, model = sdk(server), model_of(server)
    parsed = client.responses.parse(model=model, input="Name a city in Italy.",
                                    text_format=City, temperature=0, max_output_tokens=64,
                                    store=False)
    assert isinstance(parsed.output_parsed, City)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(parsed.id)


@pytest.mark.parametrize("change, param", [
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"background": True}, "background"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
])
def test_refusals_name_the_field(server, change, param):
    with pytest.raises(BadRequestError) as refused:
        sdk(server).responses.create(model=model_of(server), input="Hi",
                                     extra_body=change)
    assert (refused.value.body["param"] or "").startswith(param), refused.value.body


def test_the_docs_table_names_every_field_the_server_reads():
    from reame.web.v1.responses_request import ResponsesRequest

    from tests.conftest import ROOT

    table = (ROOT / "docs" / "api.md").read_text().split("| responses field | here |")[1]
    table = table.split("\n\n")[0]
    named = {name for row in table.splitlines() if row.startswith("|")
             for name in row.split("|")[1].split("`")[1::2]}
    assert set(ResponsesRequest.model_fields) <= named, set(ResponsesRequest.model_fields) - named
