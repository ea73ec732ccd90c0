"""The agent frameworks apps build on, unmodified, against a real server with the bundled SmolLM2:
langchain-openai's `bind_tools` and `with_structured_output`, and the OpenAI Agents SDK with a
function tool (through its chat-completions model: naiad serves no Responses API)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from conftest import ServerProcess
from pydantic import BaseModel, Field

from e2e.llm_server import MODEL, llm_server

pytestmark = pytest.mark.e2e


class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=20)
    celsius: int = Field(ge=-50, le=60)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server: ServerProcess
    with llm_server(tmp_path_factory.mktemp("agents-repo")) as server:
        yield f"http://{server.url}/v1"


def test_langchain_bind_tools_and_structured_output(base_url: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return f"sunny in {city}"

    chat = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", temperature=0, max_tokens=64,  # type: ignore[arg-type]
                      max_retries=0)
    # One call: under "required" with parallel calls, greedy SmolLM2 repeats its call until max_tokens.
    message = chat.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke(
        "What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"  # type: ignore[attr-defined]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)  # type: ignore[attr-defined]
    for method in ("json_schema", "function_calling"):
        answer = chat.with_structured_output(Weather, method=method).invoke(  # type: ignore[arg-type]
            "Describe the weather in Paris.")
        assert isinstance(answer, Weather)


def test_openai_agents_calls_a_function_tool(base_url: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        asked.append(city)
        return f"sunny in {city}"

    async def run() -> str:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                      model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64,
                                                   parallel_tool_calls=False),
                      tool_use_behavior="stop_on_first_tool")
        result = await Runner.run(agent, "What is the weather in Paris?")
        return str(result.final_output)

    output = asyncio.run(run())
    assert asked and output == f"sunny in {asked[0]}"
