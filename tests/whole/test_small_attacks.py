"""One small request must never crash or stall the server: grammars, schemas, tools and
logit_bias from one client, against a real server process over HTTP. Each attack is tried as
it was found (a body of a few hundred bytes) and then the server is asked whether it lives
(/health) and still answers an honest request.

The token ids the attacks bias are found in the model's own vocabulary (the engine fixture),
not written down: another tokenizer has other ids.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reame.inference.grammar_bounds import GrammarError
from reame.inference.held import TriggerWatch

from tests.conftest import FULL, Server, start_server
from tests.accounts.test_accounts import v1

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    server = start_server(tmp_path_factory.mktemp("attacks"), model_path=model_path,
                          max_tokens=16)
    yield server
    server.stop()


def alive(server: Server) -> None:
    """The process lives, /health answers and an honest request is answered."""
    assert server.process.poll() is None, server.log_path.read_text()[-3000:]
    with urllib.request.urlopen(server.url + "health", timeout=10) as answer:
        assert answer.status == 200
    status, answer = v1(server, "chat/completions", body={
        "model": MODEL, "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Say hi."}]})
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"]


def chat(server: Server, **body) -> tuple[int, dict]:
    return v1(server, "chat/completions", body={
        "model": MODEL, "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "user", "content": "Give me a JSON object about a cat."}],
        **body})


def tokens_starting(engine, prefixes: tuple[str, ...]) -> list[int]:
    return [t for t in range(engine.n_vocab)
            if engine.token_text(t).startswith(prefixes)
            and not engine.is_end(t)]


def test_a_grammar_whose_every_opening_is_banned_is_a_400_naming_logit_bias(server, engine):
    """The sampler used to hand the grammar a token it refused: llama.cpp aborted the process
    (SIGABRT) on a 325-byte body."""
    openings = tokens_starting(engine, ("{",))
    assert 0 < len(openings) < 300
    banned = {str(t): -100 for t in openings}
    for stream in (False, True):  # refused before the first byte: a plain error either way
        status, answer = chat(server, response_format={"type": "json_object"},
                              logit_bias=banned, stream=stream)
        assert status == 400, answer
        assert answer["error"]["param"] == "logit_bias", answer
        alive(server)


def test_a_dead_end_in_the_middle_of_a_reply_ends_it_with_an_error_naming_logit_bias(
        server, engine):
    """The grammar lets the reply begin ('{"animal": "'), then allows only "zebra", whose
    every token logit_bias bans: the stream ends with an error, the process lives."""
    banned = {str(t): -100 for t in range(engine.n_vocab) if "z" in engine.token_text(t)}
    schema = {"type": "object", "properties": {"animal": {"enum": ["zebra"]}},
              "required": ["animal"]}
    body = {"model": MODEL, "temperature": 0, "max_tokens": 16, "stream": True,
            "logit_bias": banned, "messages": [{"role": "user", "content": "An animal?"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}
    request = urllib.request.Request(server.url + "v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        events = [json.loads(line[6:]) for line in answer.read().decode().splitlines()
                  if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if e.get("choices"))
    assert text.startswith("{"), events
    assert "logit_bias" in events[-1]["error"]["message"], events[-1]
    alive(server)


def test_a_required_tool_call_whose_opening_is_banned_is_a_400(server, engine):
    banned = {str(t): -100 for t in tokens_starting(engine, ("<",))}
    status, answer = chat(server, logit_bias=banned, tool_choice="required", tools=[{
        "type": "function", "function": {"name": "get_cat", "parameters": {
            "type": "object", "properties": {"name": {"type": "string"}}}}}])
    assert status == 400, answer
    assert answer["error"]["param"] == "logit_bias", answer
    alive(server)


@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_a_pattern_nested_past_the_stack_is_refused_not_a_segfault(server, where):
    """`^a{0,28400}$` becomes 199,128 characters of grammar nested 28,400 groups deep: under
    the size bound, and llama.cpp's recursive parser overflowed the stack."""
    schema = {"type": "object", "properties": {"a": {"type": "string",
                                                     "pattern": "^a{0,28400}$"}}}
    if where == "response_format":
        status, answer = chat(server, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert answer["error"]["param"] == "response_format", answer
    else:
        status, answer = chat(server, tools=[{"type": "function", "function": {
            "name": "f", "parameters": schema}}])
        assert answer["error"]["param"] == "tools[0].function.parameters", answer
    assert status == 400
    assert "28,400" in answer["error"]["message"]
    alive(server)


def test_a_bounded_pattern_still_holds_the_reply(server):
    status, answer = chat(server, max_tokens=24, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"code": {"type": "string",
                                                      "pattern": "^[a-c]{2,5}$"}},
            "required": ["code"]}}})
    assert status == 200, answer
    code = json.loads(answer["choices"][0]["message"]["content"])["code"]
    assert 2 <= len(code) <= 5 and set(code) <= set("abc")


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a{3000000}$"},
    {"type": "array", "items": {"type": "string"}, "minItems": 100000000},
    {"type": "string", "pattern": "^((a{900}){900}){900}$"},
])
def test_a_schema_too_big_to_convert_is_refused_at_once_and_health_answers_meanwhile(
        server, schema):
    """Such a schema held the event loop for 26.9 s and took 4.0 GB before the size check;
    now it is reckoned from its numbers before it is converted, off the event loop."""
    health: list[float] = []
    done = threading.Event()

    def poll():
        while not done.is_set():
            started = time.monotonic()
            with urllib.request.urlopen(server.url + "health", timeout=30):
                health.append(time.monotonic() - started)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        started = time.monotonic()
        status, answer = chat(server, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        took = time.monotonic() - started
    finally:
        done.set()
        poller.join(60)
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    # Refused by arithmetic: milliseconds where the conversion took half a minute.
    assert took < 5, took
    assert health and max(health) < 5, health
    alive(server)


def test_a_grammar_too_deep_for_llama_cpps_stack_never_reaches_its_parser(engine):
    """A chain of rules each starting the one before is a recursion in llama.cpp's start of a
    grammar, and a left recursion is one its own check walks by recursion: both are
    reckoned from the text first (the schema converter makes neither today; a grammar given
    another way must not either)."""
    chain = "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1}" for i in range(10_000))
    for grammar in (chain + '\nr10000 ::= "a"', 'root ::= x "a"\nx ::= root | "b"',
                    "root ::= " + '("a" ' * 20_000 + ")?" * 20_000):
        with pytest.raises(GrammarError, match="nests over"):
            engine.check_grammar(grammar)
    engine.check_grammar(chain[:chain.index("r1000 ::=")] + 'r1000 ::= "a"')  # 1,000: fine


@pytest.mark.slow
def test_a_long_reply_under_a_lazy_tool_grammar_costs_what_one_without_tools_costs(
        server, engine):
    """llama.cpp matched the tool call's trigger regex against the whole reply at every
    token: 0.149 s a token at first, 2.9 s a token by 9,600 characters. The reply with tools
    offered is timed against the very same reply without them, in this test."""
    hashes = max((t for t in range(engine.n_vocab) if set(engine.token_text(t)) == {"#"}),
                 key=lambda t: len(engine.token_text(t)))
    assert len(engine.token_text(hashes)) >= 16
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object"}}}]
    times: dict[bool, list[float]] = {}
    for offered in (True, False, True, False):
        started = time.monotonic()
        status, answer = chat(server, max_tokens=120, logit_bias={str(hashes): 100},
                              **({"tools": tools, "tool_choice": "auto"} if offered else {}))
        assert status == 200, answer
        assert answer["usage"]["completion_tokens"] == 120
        times.setdefault(offered, []).append(time.monotonic() - started)
    # Before: 45 s against 2.3 s on one thread (120 tokens of 80 '#'). A generous bound for
    # a loaded machine: each the quicker of two tries.
    assert min(times[True]) < 5 * min(times[False]) + 5, times
    alive(server)


def test_the_trigger_watch_finds_the_trigger_across_tokens_and_hands_over_its_tokens():
    watch = TriggerWatch("<tool_call>")
    pieces = [(1, b"Sure, "), (2, b"here <"), (3, b"tool"), (4, b"_call"), (5, b">\n{")]
    found = [watch.seen(token, piece) for token, piece in pieces]
    assert found[:4] == [None] * 4
    assert found[4] == [2, 3, 4, 5]  # from the token where "<" is
    assert watch.since_trigger == b"<tool_call>\n{"

    watch = TriggerWatch("<tool_call>")
    assert watch.seen(7, b"x" * 5000) is None
    assert watch.seen(8, b"<tool_call>") == [8]
    watch.skip()  # not what the grammar allows: the next one counts
    assert watch.seen(9, b" and <tool_") is None
    assert watch.seen(10, b"call>") == [9, 10]


# The fuzz: schemas, patterns, tools and biases built by hypothesis, each request bounded in
# time and the process alive after it. Counts reach 10**9 and patterns nest repetitions of up
# to 40,000: most are refused by their reckoned cost, the rest are followed.
FUZZ = settings(max_examples=120 if FULL else 24, deadline=None, derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])
REQUEST_BOUND_S = 60  # one request of at most 8 tokens, on a busy machine

count = st.integers(0, 10**9) | st.integers(0, 50)
quantifier = (st.sampled_from(["", "", "?", "*", "+"])
              | st.integers(0, 40_000).map(lambda n: f"{{{n}}}")
              | st.tuples(st.integers(0, 3_000), st.integers(0, 40_000)).map(
                  lambda p: f"{{{min(p)},{max(p)}}}"))
atom = st.sampled_from(["a", "[a-z]", ".", "\\d", "(ab|c)", "\\p{L}", "[^\"]", "x|y"])
regex = st.recursive(st.tuples(atom, quantifier).map("".join),
                     lambda inner: st.tuples(st.lists(inner, min_size=1, max_size=3).map("".join),
                                             quantifier).map(lambda p: f"({p[0]}){p[1]}"),
                     max_leaves=5)
leaf = st.one_of(
    regex.map(lambda p: {"type": "string", "pattern": f"^{p}$"}),
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": count, "maxLength": count}),
    st.fixed_dictionaries({"type": st.just("integer")},
                          optional={"minimum": st.integers(-10**30, 10**30),
                                    "maximum": st.integers(-10**30, 10**30)}),
    st.just({"type": "boolean"}), st.just({"enum": ["a", "b"]}))
json_schema = st.recursive(leaf, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                          optional={"minItems": count, "maxItems": count}),
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, min_size=1,
                    max_size=3).map(lambda props: {"type": "object", "properties": props,
                                                   "required": sorted(props)})),
    max_leaves=6)
ref_chain = st.integers(1, 50).map(lambda n: {
    "$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)},
              f"d{n}": {"type": "string"}}, "$ref": "#/$defs/d0"})
parameters = json_schema.map(
    lambda s: s if s.get("type") == "object" else {"type": "object", "properties": {"x": s}})


@functools.cache
def openings(engine) -> list[int]:
    """The tokens that open JSON or a call: a pass over the whole vocabulary (about 0.4 s),
    made once, not at each example."""
    return [t for t in range(engine.n_vocab) if engine.token_text(t)[:1] in ("{", "<", "[")]


@st.composite
def held_request(draw, engine):
    """A request whose reply a grammar holds (a response format or tools), with biases."""
    body = {"model": MODEL, "max_tokens": draw(st.integers(1, 8)),
            "temperature": draw(st.sampled_from([0, 0.7, 2])),
            "seed": draw(st.integers(0, 100)), "stream": draw(st.booleans()),
            "messages": [{"role": "user", "content": draw(st.sampled_from(
                ["A JSON object, please.", "Call a tool.", "Hello"]))}]}
    held = draw(st.sampled_from(["json_object", "json_schema", "tools"]))
    if held == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif held == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "x", "schema": draw(json_schema | ref_chain)}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": f"f{n}",
                                                           "parameters": draw(parameters)}}
                         for n in range(draw(st.integers(1, 2)))]
        body["tool_choice"] = draw(st.sampled_from(["auto", "required", "none"]))
    # Biases on any tokens, on the tokens that open JSON or a call, or none.
    opening = openings(engine)
    pool = draw(st.sampled_from(["any", "openings", "none"]))
    if pool != "none":
        tokens = (st.integers(0, engine.n_vocab - 1) if pool == "any"
                  else st.sampled_from(opening))
        body["logit_bias"] = {str(t): b for t, b in draw(st.dictionaries(
            tokens, st.sampled_from([-100, 100, -3, 3]), max_size=300)).items()}
    return body


@pytest.mark.slow
def test_grammars_schemas_tools_and_biases_never_crash_or_stall_the_server(server, engine):
    @FUZZ
    @given(body=held_request(engine))
    def one(body):
        started = time.monotonic()
        request = urllib.request.Request(server.url + "v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_BOUND_S) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read()
        took = time.monotonic() - started
        event(f"HTTP {status}")
        assert server.process.poll() is None, server.log_path.read_text()[-3000:]
        assert status < 500, text[:500]
        assert took < REQUEST_BOUND_S, took
        if status != 200:
            assert json.loads(text)["error"]["message"]

    one()
    alive(server)


def test_a_trigger_followed_by_what_the_grammar_refuses_stays_text(engine):
    """llama.cpp, handed "<tool_call>x", throws from its grammar and the process aborts: the
    text after a trigger is checked against a fresh copy of the grammar first."""
    from reame.inference.tools import Tool, ToolUse, grammar

    gbnf, lazy = grammar(ToolUse((Tool("f"),), "auto"))
    assert lazy
    assert engine._grammar_takes(gbnf, b'<tool_call>\n{"name": "f')
    assert not engine._grammar_takes(gbnf, b"<tool_call>x")
    assert not engine._grammar_takes(gbnf, b'<tool_call>\n{"name": "g')
