"""Tool calls in a stored chat: /v1/chat/completions with X-Reame-Chat and tools, with the
official `openai` SDK against a real server. The reply that calls a tool is kept in the chat
with its calls, the client's tool results are kept after it, and the answer to them evaluates
only the results, live and after a restart (the prompt rebuilt from the store is the tokens the
live turn held); the answer is the one a stateless conversation with the same calls gets."""

from __future__ import annotations

import pytest

from tests.conftest import Server, start_server
from tests.gradio_api import ApiClient
from tests.reference import assert_answers
from tests.inference.test_tools import (
    ANSWER_TOKENS,
    ASK,
    RESULT,
    TOOLS,
    assert_valid,
    model_of,
    sdk,
    streamed_calls,
)
from tests.web.v1.test_openai import post

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("chat-tools"), model_path=model_path,
                          max_tokens=160)
    yield server
    server.stop()


def header(chat_id: int) -> dict:
    return {"X-Reame-Chat": str(chat_id)}


def stored(server: Server, chat_id: int) -> list[dict]:
    return ApiClient(server.url, verbose=False).predict(chat_id, api_name="/get_chat")["messages"]


def test_a_stored_chat_keeps_a_call_and_its_result_and_answers_from_its_kv(server):
    gradio = ApiClient(server.url, verbose=False)
    chat_id = gradio.predict(api_name="/new_chat")
    client, model = sdk(server), model_of(server)
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=0,
                                           extra_headers=header(chat_id))
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    calls = choice.message.tool_calls
    assert_valid(calls)
    kept = stored(server, chat_id)
    assert [m["role"] for m in kept] == ["user", "assistant"]
    assert kept[1]["content"] == "" and "<tool_call>" not in kept[1]["content"]
    assert kept[1]["tool_calls"] == [{"id": c.id, "name": c.function.name,
                                      "arguments": c.function.arguments} for c in calls]

    # The agent's next step: the whole conversation, ending with the tools' results.
    conversation = ASK + [choice.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": call.id, "content": RESULT} for call in calls]
    answer = client.chat.completions.create(
        model=model, messages=conversation, tools=TOOLS, tool_choice="none", temperature=0,
        max_tokens=ANSWER_TOKENS, extra_headers=header(chat_id))
    reply = answer.choices[0]
    assert reply.message.tool_calls is None and reply.message.content.strip(), reply
    extra = answer.model_extra["reame"]
    assert extra["source"] == "live", extra
    assert extra["reused"] > first.usage.prompt_tokens + 20, "through the call: " + str(extra)
    assert extra["prefilled"] < 40 * len(calls), "only the results and the reply's header"
    assert answer.usage.prompt_tokens_details.cached_tokens == extra["reused"]
    kept = stored(server, chat_id)
    assert [m["role"] for m in kept] == ["user", "assistant"] + ["tool"] * len(calls) + [
        "assistant"]
    assert [(m["tool_call_id"], m["content"]) for m in kept[2:-1]] == [
        (c.id, RESULT) for c in calls]
    assert kept[-1]["content"] == reply.message.content

    # The same conversation sent without the header (nothing stored, the chat's system
    # prompt first) is answered alike: its call is re-tokenized from the text, the chat's is
    # the tokens the model wrote, so the first word is compared (tests/reference.py).
    system = gradio.predict(chat_id, api_name="/get_chat")["system_prompt"]
    alone = client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": system}] + conversation,
        tools=TOOLS, tool_choice="none", temperature=0, max_tokens=ANSWER_TOKENS)
    assert_answers(reply.message.content, alone.choices[0].message.content, n=1)

    # After a restart the chat's KV comes back from its file: the history rebuilt from the
    # store (the call, its result) is the tokens the KV holds, and only the new message is
    # evaluated.
    before = answer.usage.prompt_tokens + answer.usage.completion_tokens
    server.restart()
    follow = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "And in Rome?"}], tools=TOOLS,
        tool_choice="required", temperature=0, extra_headers=header(chat_id))
    extra = follow.model_extra["reame"]
    assert extra["source"] == "disk", extra
    assert extra["reused"] >= before, (extra, before)
    assert extra["prefilled"] < 20, extra
    assert_valid(follow.choices[0].message.tool_calls)


def test_a_streamed_call_is_kept_with_the_ids_the_stream_sent(server):
    chat_id = ApiClient(server.url, verbose=False).predict(api_name="/new_chat")
    client, model = sdk(server), model_of(server)
    content, calls, finish, _ = streamed_calls(client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
        stream=True, extra_headers=header(chat_id)))
    assert (content, finish) == ("", "tool_calls") and calls
    kept = stored(server, chat_id)
    assert kept[-1]["tool_calls"] == calls
    results = [{"role": "tool", "tool_call_id": c["id"], "content": RESULT} for c in calls]
    again, answered, finish, _ = streamed_calls(client.chat.completions.create(
        model=model, messages=results, tools=TOOLS, tool_choice="none", temperature=0,
        max_tokens=ANSWER_TOKENS, stream=True, extra_headers=header(chat_id)))
    assert again.strip() and answered == [] and finish in ("stop", "length")
    assert stored(server, chat_id)[-1]["content"] == again


def test_results_that_answer_no_call_of_the_chat_are_refused_by_name(server):
    """Results for no call, for another call, twice: a 400 naming messages; and a reply
    that called tools is not continued (its calls wait for results)."""
    chat_id = ApiClient(server.url, verbose=False).predict(api_name="/new_chat")
    model = model_of(server)
    result = {"role": "tool", "tool_call_id": "call_x", "content": RESULT}
    status, answer = post(server, {"model": model, "messages": [result]},
                          headers=header(chat_id))
    assert status == 400 and answer["error"]["param"] == "messages", answer
    assert "not a reply that called tools" in answer["error"]["message"]
    first = sdk(server).chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
        extra_headers=header(chat_id))
    status, answer = post(server, {"model": model, "messages": [result]},
                          headers=header(chat_id))
    assert status == 400 and "call_x" in answer["error"]["message"], answer
    calls = first.choices[0].message.tool_calls
    twice = [{**result, "tool_call_id": calls[0].id}] * 2
    status, answer = post(server, {"model": model, "messages": twice}, headers=header(chat_id))
    assert status == 400 and "twice" in answer["error"]["message"], answer
    # JSON asked for beside tools: a stored chat's reply follows no response_format.
    status, answer = post(server, {"model": model, "messages": ASK, "tools": TOOLS,
                                   "tool_choice": "none",
                                   "response_format": {"type": "json_object"}},
                          headers=header(chat_id))
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    with pytest.raises(Exception, match="called tools is not continued"):
        ApiClient(server.url, verbose=False).predict(chat_id, api_name="/continue_reply")
    assert [m["role"] for m in stored(server, chat_id)] == ["user", "assistant"], "nothing kept"
