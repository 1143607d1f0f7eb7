"""The OpenAI API's structured output and tool calling with the second model, Gemma 3 (270M, a
sliding-window model without a tools section in its template), on a real server: what
test_openai.py and test_tools.py check with SmolLM2."""

from __future__ import annotations

import pytest

from tests.conftest import FULL, Server, start_server
from tests.structured import assert_structured_output
from tests.inference.test_tools import assert_round_trip, sdk


@pytest.fixture(scope="module")
def server(tmp_path_factory, gemma_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("gemma-v1"), model_path=gemma_path,
                          max_tokens=160)
    yield server
    server.stop()


# make test asks Gemma each thing one way (its grammar-held tokens are slow: a 262k
# vocabulary), whole or streamed: whether a reply is streamed is the server's code, the same for
# either model, and test_openai.py and test_tools.py check both ways with SmolLM2. make
# test-full (FULL) asks Gemma both ways too.
def test_gemma_parse_returns_valid_objects_for_three_schemas(server):
    client = sdk(server)
    assert_structured_output(client, client.models.list().data[0].id, both_ways=FULL)


def test_gemma_does_a_tool_call_round_trip_streamed_or_not(server):
    assert_round_trip(server, streamed=FULL)
