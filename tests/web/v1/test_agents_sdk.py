"""The OpenAI Agents SDK's default model (the Responses API) runs an agent with a function tool
against a real server: the model calls the tool, the SDK runs it and sends its result, the
agent answers."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, OpenAI

from tests.conftest import Server, start_server

RESULT = "18 degrees and cloudy"


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path) -> Server:
    server = start_server(tmp_path_factory.mktemp("agents"), model_path=model_path,
                          max_tokens=160)
    yield server
    server.stop()


@pytest.mark.slow
def test_an_agent_with_a_function_tool_runs_against_reame(server):
    model = OpenAI(base_url=server.url + "v1", api_key="unused").models.list().data[0].id
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return RESULT

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=server.url + "v1", api_key="unused",
                                          max_retries=0, timeout=120), use_for_tracing=False)
    agent = Agent(name="Weather", instructions="You answer questions about the weather in one short sentence.",
                  model=model, tools=[get_weather],
                  model_settings=ModelSettings(tool_choice="required", temperature=0,
                                               max_tokens=400))
    result = asyncio.run(Runner.run(agent, "What is the weather like in Paris right now?",
                                    max_turns=4))
    assert asked and all(isinstance(city, str) and city for city in asked)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    responses = [r for r in result.raw_responses]
    assert len(responses) >= 2, "a call, then the answer after its result"
    assert any(item.type == "function_call" for item in responses[0].output)
