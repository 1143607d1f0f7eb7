"""POST /v1/completions (OpenAI's legacy text completions) on a real server process, with the
official `openai` SDK and raw HTTP: text in, text out, streamed or not; a resent growing text
reusing its KV; every parameter honoured or refused by name; a client that hangs up stopping
its turn. Greedy texts are compared with the model's own continuation computed here (reame's
Engine, a cold prefill of the same tokens), never with words seen once on one CPU."""

from __future__ import annotations

import http.client
import json
import math
import socket
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import APIStatusError, OpenAI

from reame.inference.engine import Engine
from reame.inference.sampling import Sampling

from tests.conftest import FULL, ROOT, THREADS, Server, start_server
from tests.server_metrics import metric, settle

CAPITAL = "The capital city of France is"
# Over one block of the KV index (64 tokens): its KV is saved to a file, found by its tokens.
STORY = ("Once upon a time, in a small village at the edge of a great forest, there lived an old "
         "baker named Tom. Every morning he rose before the sun to bake bread for the people of "
         "the village, and every evening he walked into the forest to gather wild herbs. One "
         "evening, deep among the trees, he looked for the rarest of them all. That evening, "
         "under an old oak tree, he found")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("completions"), model_path=model_path,
                          max_tokens=32)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(model_path):
    """The model's greedy continuation of a text, as the server tokenizes it (control tokens
    parsed, a BOS where the model wants one), from a cold prefill in this process."""
    engine = Engine(model_path, n_ctx=2048, n_threads=THREADS)

    def continue_text(prompt: str | list[int], max_tokens: int) -> str:
        tokens = prompt if isinstance(prompt, list) else engine.tokenize(
            prompt, add_bos=engine.adds_bos, special=True)
        engine.clear()
        engine.prefill(tokens)
        return engine.detokenize(list(engine.generate(Sampling(temperature=0.0), max_tokens)))

    continue_text.engine = engine
    yield continue_text
    engine.close()


def sdk(server: Server) -> OpenAI:
    return OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=120)


def model_id(server: Server) -> str:
    return sdk(server).models.list().data[0].id


def post(server: Server, body) -> tuple[int, object]:
    """POST /v1/completions; (status, parsed JSON or the raw text of a stream)."""
    request = urllib.request.Request(server.url + "v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text, status = response.read().decode(), response.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def test_a_text_is_continued_streamed_or_not_as_the_model_continues_it(server, reference):
    client, model = sdk(server), model_id(server)
    whole = client.completions.create(model=model, prompt=CAPITAL, temperature=0, max_tokens=8)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    choice = whole.choices[0]
    # The continuation as it is, its leading space too: no chat template, nothing trimmed.
    assert choice.text == reference(CAPITAL, 8)
    assert choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason == ("length" if whole.usage.completion_tokens == 8 else "stop")
    engine = reference.engine
    assert whole.usage.prompt_tokens == len(engine.tokenize(CAPITAL, add_bos=engine.adds_bos))
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert whole.system_fingerprint.startswith("fp_")

    chunks = list(client.completions.create(model=model, prompt=CAPITAL, temperature=0,
                                            max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"text_completion"}
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 2, "streamed"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens

    status, raw = post(server, {"model": model, "prompt": CAPITAL, "temperature": 0,
                                "max_tokens": 8, "stream": True})
    events = [line for line in raw.split("\n") if line]
    assert status == 200 and all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == choice.text

    # A list of one text, and the text's token ids, are the same prompt; echo gives it back.
    tokens = engine.tokenize(CAPITAL, add_bos=engine.adds_bos)
    for prompt in ([CAPITAL], tokens, [tokens]):
        again = client.completions.create(model=model, prompt=prompt, temperature=0,
                                          max_tokens=8)
        assert again.choices[0].text == choice.text, prompt
    echoed = client.completions.create(model=model, prompt=CAPITAL, temperature=0,
                                       max_tokens=8, echo=True)
    assert echoed.choices[0].text == CAPITAL + choice.text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=CAPITAL, temperature=0, max_tokens=8, echo=True, stream=True)
        if c.choices)
    assert streamed == CAPITAL + choice.text


def test_control_tokens_in_the_text_are_parsed_no_chat_template_added(server, reference):
    """A completion client writes its own template: "<|im_start|>" is the control token, as
    llama-server parses it, and the server adds nothing around the text."""
    prompt = ("<|im_start|>user\nWhat is the capital city of France? Answer in one word."
              "<|im_end|>\n<|im_start|>assistant\n")
    reply = sdk(server).completions.create(model=model_id(server), prompt=prompt,
                                           temperature=0, max_tokens=12)
    engine = reference.engine
    assert reply.usage.prompt_tokens == len(engine.tokenize(prompt, add_bos=engine.adds_bos))
    assert reply.usage.prompt_tokens < len(engine.tokenize(prompt, add_bos=engine.adds_bos,
                                                           special=False))
    assert reply.choices[0].text == reference(prompt, 12).split("<|im_end|>")[0]


@pytest.mark.slow
def test_a_resent_growing_text_evaluates_only_its_new_tokens(server, reference):
    client, model = sdk(server), model_id(server)
    first = client.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=12)
    assert first.usage.prompt_tokens > 64
    assert first.choices[0].text == reference(STORY, 12)
    grown = STORY + first.choices[0].text + " The next morning,"
    second = client.completions.create(model=model, prompt=grown, temperature=0, max_tokens=8)
    extra = second.model_extra["reame"]
    assert second.usage.prompt_tokens_details.cached_tokens == extra["reused"]
    assert extra["reused"] >= first.usage.prompt_tokens, "the text and its completion, reused"
    assert extra["prefilled"] == second.usage.prompt_tokens - extra["reused"] < 20
    assert second.choices[0].text.split()[:1] == reference(grown, 8).split()[:1]

    # Other traffic in between, in every slot (4: the default): no live context holds the
    # text, and its KV comes from its file, found by its tokens.
    for other in ("Roses are red,", "1, 2, 3, 4,", "Dear Sir or Madam,", "def main():"):
        client.completions.create(model=model, prompt=other, temperature=0, max_tokens=4)
    third = client.completions.create(model=model, prompt=grown + second.choices[0].text
                                      + " Tom", temperature=0, max_tokens=4)
    extra = third.model_extra["reame"]
    assert extra["source"] == "prefix", "found on disk by its tokens"
    assert extra["reused"] >= second.usage.prompt_tokens and extra["prefilled"] < 20
    assert third.usage.prompt_tokens_details.cached_tokens == extra["reused"]


@pytest.mark.slow
def test_max_tokens_stop_seed_bias_and_penalties_are_honoured(server, reference):
    client, model = sdk(server), model_id(server)
    default = client.completions.create(model=model, prompt=STORY, logit_bias=no_end(reference))
    assert default.usage.completion_tokens == 16, "OpenAI's default max_tokens for completions"
    whole = reference(STORY, 24)
    word = whole.split()[2]
    stopped = client.completions.create(model=model, prompt=STORY, temperature=0,
                                        max_tokens=24, stop=[word])
    assert stopped.choices[0].text == whole[:whole.index(word)]
    assert stopped.choices[0].finish_reason == "stop"
    a, b, c = (client.completions.create(model=model, prompt=STORY, temperature=1.0,
                                         max_tokens=12, seed=seed).choices[0].text
               for seed in (42, 42, 7))
    assert a == b != c
    favoured = reference.engine.tokenize(" zebra")[0]
    piece = reference.engine.token_text(favoured)
    zebras = client.completions.create(model=model, prompt=CAPITAL, max_tokens=3,
                                       logit_bias={str(favoured): 100})
    assert zebras.choices[0].text == piece * 3
    count = "1, 2, 3, 4, 5, 6, 7, 8,"
    plain = client.completions.create(model=model, prompt=count, temperature=0, max_tokens=16)
    for penalty in ({"frequency_penalty": 2}, {"presence_penalty": 2}):
        assert client.completions.create(model=model, prompt=count, temperature=0,
                                         max_tokens=16, **penalty
                                         ).choices[0].text != plain.choices[0].text, penalty


def no_end(reference) -> dict[str, int]:
    """A logit_bias that bans the model's end tokens: a text that goes on to max_tokens."""
    engine = reference.engine
    return {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}


def test_logprobs_come_in_the_legacy_shape_streamed_or_not(server):
    client, model = sdk(server), model_id(server)
    ask = dict(model=model, prompt=CAPITAL, temperature=0, max_tokens=8, logprobs=3)
    whole = client.completions.create(**ask)
    choice = whole.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        len(lp.text_offset) == whole.usage.completion_tokens > 0
    assert "".join(lp.tokens) == choice.text
    for token, logprob, top, offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                           lp.text_offset):
        assert logprob <= 0 and choice.text[offset:offset + len(token)] == token
        assert 3 <= len(top) <= 4 and top[token] == logprob  # greedy: the likeliest
        assert max(top.values()) == logprob and sum(map(math.exp, top.values())) <= 1 + 1e-6
    streamed = [c.choices[0].logprobs for c in client.completions.create(**ask, stream=True)
                if c.choices and c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    assert all(abs(a - b) < 1e-4 for a, b in zip(
        [p for s in streamed for p in s.token_logprobs], lp.token_logprobs))
    status, answer = post(server, {**ask, "echo": True})
    assert status == 400 and answer["error"]["param"] == "echo"


# OpenAI's completions parameters (its API reference) with a value that asks for something:
# honoured (200), or refused by name (400, param set). docs/api.md's table says the same.
HONOURED = {
    "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "stop": ["zzz"], "seed": 7,
    "logit_bias": {"1": 1}, "stream": True, "stream_options": {"include_usage": True},
    "frequency_penalty": 1.0, "presence_penalty": 1.0, "logprobs": 2, "echo": True,
    "user": "someone",
}
REFUSED = {"suffix": " and so on.", "n": 2, "best_of": 3}
NEUTRAL = {
    "max_tokens": None, "temperature": None, "top_p": None, "stop": None, "seed": None,
    "logit_bias": {}, "stream_options": None, "frequency_penalty": 0, "presence_penalty": None,
    "logprobs": None, "echo": False, "user": None, "suffix": None, "n": 1, "best_of": 1,
}


def test_every_parameter_is_honoured_or_refused_by_name(server):
    model = model_id(server)
    for param, value in HONOURED.items():
        streamed = {"stream": True} if param == "stream_options" else {}
        status, answer = post(server, {"model": model, "prompt": CAPITAL, "max_tokens": 2,
                                       param: value, **streamed})
        assert status == 200, (param, answer)
    for param, value in REFUSED.items():
        status, answer = post(server, {"model": model, "prompt": CAPITAL, param: value})
        assert status == 400, (param, answer)
        error = answer["error"]
        assert (error["param"], error["code"]) == (param, "unsupported_parameter"), error
        assert param in error["message"] and "refused rather than ignored" in error["message"]
    status, answer = post(server, {"model": model, "prompt": CAPITAL, **NEUTRAL,
                                   "max_tokens": 2})
    assert status == 200 and answer["choices"][0]["text"], answer
    # Not OpenAI's, wrong types, several prompts, stream_options without stream.
    for body, param, code in (
            ({"top_k": 5}, "top_k", "unknown_parameter"),
            ({"messages": [{"role": "user", "content": "hi"}]}, "messages",
             "unknown_parameter"),
            ({"prompt": ["one", "two"]}, "prompt", "unsupported_parameter"),
            ({"prompt": [[1, 2], [3]]}, "prompt", "unsupported_parameter"),
            ({"prompt": 42}, "prompt", None), ({"prompt": []}, "prompt", None),
            ({"prompt": [-1]}, "prompt", None), ({"prompt": None}, "prompt", None),
            ({"logprobs": 6}, "logprobs", None), ({"logprobs": True}, "logprobs", None),
            ({"echo": "yes"}, "echo", None), ({"max_tokens": 0}, "max_tokens", None),
            ({"stream_options": {"include_usage": True}}, "stream_options", None),
            ({"stop": ""}, "stop", None)):
        status, answer = post(server, {"model": model, "prompt": CAPITAL, **body})
        assert status == 400, (body, answer)
        assert (answer["error"]["param"], answer["error"]["code"]) == (param, code), answer
        assert "pydantic" not in answer["error"]["message"]
    status, answer = post(server, {"prompt": CAPITAL})
    assert status == 400 and answer["error"]["param"] == "model"
    status, answer = post(server, {"model": "gpt-3.5-turbo-instruct", "prompt": CAPITAL})
    assert status == 404 and answer["error"]["code"] == "model_not_found"


def test_a_prompt_too_long_or_out_of_the_vocabulary_is_openai_s_400(server, reference):
    client, model = sdk(server), model_id(server)
    with pytest.raises(APIStatusError) as overflow:
        client.completions.create(model=model, prompt="word " * 4000)
    assert overflow.value.status_code == 400
    assert overflow.value.body["code"] == "context_length_exceeded"
    assert overflow.value.body["param"] == "prompt"
    empty = [] if reference.engine.adds_bos else [({"prompt": ""}, "empty")]  # else a BOS
    for body, needle in (({"prompt": [reference.engine.n_vocab]}, "vocabulary"), *empty,
                         ({"logit_bias": {"999999999": 1}}, "vocabulary")):
        status, answer = post(server, {"model": model, "prompt": CAPITAL, **body})
        assert status == 400 and needle in answer["error"]["message"], (body, answer)
    assert post(server, {"model": model, "prompt": CAPITAL, "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_stops_its_completion(server, reference, stream):
    """Counted, not timed: the abandoned turn ends "stopped" instead of running its 400
    tokens to the end ("done"), streamed or not."""
    stopped = metric(server, "reame_turns_total", kind="stateless", outcome="stopped")
    done = metric(server, "reame_turns_total", kind="stateless", outcome="done")
    body = json.dumps({"model": model_id(server), "prompt": STORY, "max_tokens": 400,
                       "temperature": 0, "stream": stream, "logit_bias": no_end(reference)})
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        if stream:
            seen = b""
            while seen.count(b"data: ") < 3:  # a few tokens streamed
                chunk = sock.recv(4096)
                assert chunk, seen
                seen += chunk
        else:
            time.sleep(1.0)
    settle(server, timeout=60)
    assert metric(server, "reame_turns_total", kind="stateless", outcome="stopped") == \
        stopped + 1
    assert metric(server, "reame_turns_total", kind="stateless", outcome="done") == done
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": model_id(server), "prompt": CAPITAL, "max_tokens": 2}),
        {"Content-Type": "application/json"})
    assert conn.getresponse().status == 200, "the server goes on serving"
    conn.close()


MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                        max_leaves=10)
token_ids = st.lists(st.integers(0, 49151), min_size=1, max_size=8)
# A valid request: every field in its range ...
valid = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.integers(1, 3),
     "prompt": st.text(min_size=1, max_size=200) | token_ids | st.lists(
         st.text(min_size=1, max_size=50), min_size=1, max_size=1)},
    optional={"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "seed": st.integers(0, 2**32 - 2), "stream": st.booleans(),
              "stop": st.text(min_size=1, max_size=4) | st.lists(
                  st.text(min_size=1, max_size=4), max_size=4),
              "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
              "logprobs": st.integers(0, 5), "echo": st.booleans(), "user": st.text(max_size=8),
              "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100),
                                            max_size=3)})
# ... with one field replaced by anything, or one more field of any name and value.
broken = st.tuples(valid, st.sampled_from(
    ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
     "stream_options", "frequency_penalty", "presence_penalty", "logprobs", "echo", "user",
     "logit_bias", "suffix", "n", "best_of"]) | st.text(max_size=12), anything).map(
    lambda b: {**b[0], b[1]: b[2]})


@settings(max_examples=120 if FULL else 30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=st.one_of(valid, broken, anything))
def test_any_body_is_answered_or_refused_never_a_500(server, body):
    status, answer = post(server, body)
    assert status < 500, (status, answer)
    if status != 200:
        assert answer["error"]["message"], answer
    elif isinstance(answer, str):  # a stream: chunks, then [DONE]
        assert answer.rstrip().endswith("data: [DONE]") and '"error"' not in answer, answer
    else:
        assert answer["object"] == "text_completion", answer


def test_the_docs_table_names_every_completions_parameter():
    """docs/api.md's "/v1/completions" table and the request model stay one list."""
    from reame.web.v1.completions_request import CompletionsBody

    table = (ROOT / "docs" / "api.md").read_text().split("| completions parameter | here |")[1]
    table = table.split("\n\n")[0]
    named = {name for row in table.splitlines() if row.startswith("|")
             for name in row.split("|")[1].split("`")[1::2]}
    assert set(CompletionsBody.model_fields) == named, set(CompletionsBody.model_fields) ^ named
    assert set(HONOURED) | set(REFUSED) | set(NEUTRAL) <= set(CompletionsBody.model_fields)
