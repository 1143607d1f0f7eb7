"""/v1's smaller gaps against a real server: GET /v1/models/{id}, every unknown path in OpenAI's
error shape, a conversation of only a system message answered, any 64-bit seed (the same seed
the same reply), and a tool call cut by max_tokens never shown as content."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from tests.conftest import Server, start_server
from tests.reference import assert_answers, model_answer
from tests.inference.test_tools import ASK, TOOLS, streamed_calls

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("gaps"), model_path=model_path,
                          max_tokens=32)
    yield server
    server.stop()


def sdk(server: Server) -> OpenAI:
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=120)


def raw(server: Server, method: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + path, method=method, data=(
        b"{}" if method == "POST" else None), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_one_model_by_its_id_and_unknown_paths_in_openai_s_shape(server):
    client = sdk(server)
    name = client.models.list().data[0].id
    model = client.models.retrieve(name)
    assert model.id == name and model.object == "model" and model.owned_by == "reame"
    with pytest.raises(NotFoundError) as refused:
        client.models.retrieve("no-such-model")
    assert refused.value.body["code"] == "model_not_found"
    for method, path in (("GET", "v1/nothing"), ("POST", "v1/chat/nothing"),
                         ("DELETE", "v1/files/file-1"), ("GET", "v1/")):
        status, body = raw(server, method, path)
        assert status == 404, (method, path)
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == "invalid_request_error"
    status, body = raw(server, "GET", "v1/chat/completions")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


def test_a_conversation_of_only_a_system_message_is_answered(server):
    system = "You are a poet. Write one line about the sea."
    reply = sdk(server).chat.completions.create(
        model=sdk(server).models.list().data[0].id, temperature=0,
        messages=[{"role": "system", "content": system}])
    assert_answers(reply.choices[0].message.content,
                   model_answer(system_prompt=system, max_tokens=32))


@pytest.mark.slow
def test_any_64_bit_seed_is_accepted_the_same_seed_the_same_reply(server):
    client = sdk(server)
    model = client.models.list().data[0].id

    def sampled(seed: int, api: str = "chat") -> str:
        if api == "text":
            return client.completions.create(model=model, prompt="Once upon a time",
                                             temperature=1.0, max_tokens=12,
                                             seed=seed).choices[0].text
        return client.chat.completions.create(model=model, messages=STORY, temperature=1.0,
                                              max_tokens=12, seed=seed).choices[0].message.content

    for seed in (-1, 2**40, 2**63 - 1, -2**63):
        assert sampled(seed) == sampled(seed), seed
    assert sampled(2**40, "text") == sampled(2**40, "text")
    assert len({sampled(seed) for seed in (-1, 2**40, 5)}) > 1, "seeds differ"
    for bad in (2**64, -2**63 - 1, "7", 1.5):
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=STORY, seed=bad)
        assert refused.value.body["param"] == "seed", bad


@pytest.fixture(scope="module")
def uncut_length(server) -> int:
    """The tokens of the uncut tool call (asked whole, for both ways of asking below: once)."""
    client = sdk(server)
    whole = client.chat.completions.create(model=client.models.list().data[0].id,
                                           messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=160)
    return whole.usage.completion_tokens


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_never_leaks_its_markup_into_content(server, stream,
                                                                     uncut_length):
    client = sdk(server)
    model = client.models.list().data[0].id
    length = uncut_length
    # Cut in the first call, and (the model repeats it) wherever a later one would be.
    for max_tokens in sorted({3, 8, max(4, length // 2), length - 2, length + 6, length + 20}):
        asked = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                     temperature=0, max_tokens=max_tokens)
        if stream:
            content, calls, finish, _ = streamed_calls(
                client.chat.completions.create(**asked, stream=True))
        else:
            reply = client.chat.completions.create(**asked)
            message, finish = reply.choices[0].message, reply.choices[0].finish_reason
            content = message.content or ""
            calls = message.tool_calls or []
        assert "<tool_call>" not in content and '"name"' not in content, (max_tokens, content)
        if max_tokens < length:
            assert finish == "length", max_tokens
