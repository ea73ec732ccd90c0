"""Function calling through the `openai` client unmodified, on a real server with the bundled
SmolLM2 (whose chat template knows no tools: they are described in its system message):
tool_choice "required" and a named function give schema-valid calls, streamed and not; a
two-turn conversation (call, tool result, answer); "auto" and "none"; bad forms are 400s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from e2e.llm_server import MODEL, llm_client

pytestmark = pytest.mark.e2e

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS: list[Any] = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with llm_client(tmp_path_factory.mktemp("tools-repo")) as client:
        yield client


def _valid(call: Any) -> str:
    tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert call.type == "function" and call.id.startswith("call_")
    return str(call.function.name)


def test_required_gives_schema_valid_calls_streamed_or_not(client: openai.OpenAI) -> None:
    for seed in range(3):
        # One call each (parallel calls let a small model repeat its call until max_tokens).
        answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                temperature=1.0, seed=seed, max_tokens=96, parallel_tool_calls=False)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            _valid(call)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                 temperature=0, max_tokens=96, stream=True,
                                                 parallel_tool_calls=False))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices and chunk.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0].tool_calls is not None and len(deltas[0].tool_calls) == 1
    _valid(deltas[0].tool_calls[0])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=1.0, seed=3,
                                            tool_choice={"type": "function", "function": {"name": "get_time"}},
                                            max_tokens=96, parallel_tool_calls=False)
    calls = answer.choices[0].message.tool_calls
    assert calls and all(_valid(call) == "get_time" for call in calls)


def test_a_two_turn_tool_conversation(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=96,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, temperature=0,
                                            max_tokens=48)
    message = second.choices[0].message
    assert message.content or message.tool_calls


def test_auto_and_none(client: openai.OpenAI) -> None:
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
    message = auto.choices[0].message
    if message.tool_calls:  # what SmolLM2 chooses is its own: whatever it is, well formed
        assert auto.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            _valid(call)
    else:
        assert message.content and auto.choices[0].finish_reason in ("stop", "length")
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",
                                          temperature=0, max_tokens=16)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


@pytest.mark.parametrize(("extra", "message"), [
    ({"tools": [{"type": "code"}]}, "'tools[0]' must be"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "letters, digits"),
    ({"tools": [WEATHER, WEATHER]}, "two functions are named"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not one of the tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "'tool_choice' must be"),
    ({"tool_choice": "required"}, "'tool_choice' needs 'tools'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "'parallel_tool_calls' must be true or false"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "goes with no"),
    ({"messages": [{"role": "user", "content": None, "tool_calls": []}]}, "on an assistant's message"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]},
     "a string 'name' and 'arguments'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "needs a string 'tool_call_id'"),
])
def test_bad_tool_fields_are_bad_requests(client: openai.OpenAI, extra: dict[str, Any], message: str) -> None:
    body: dict[str, Any] = {"messages": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, max_tokens=4, **body)
    assert message in caught.value.message


def test_auto_streamed_is_the_same_answer_as_not(client: openai.OpenAI) -> None:
    for question in (ASK, [{"role": "user", "content": "Say hello."}]):
        answer = client.chat.completions.create(model=MODEL, messages=question, tools=TOOLS, temperature=0,
                                                max_tokens=48)
        chunks = [chunk for chunk in client.chat.completions.create(
            model=MODEL, messages=question, tools=TOOLS, temperature=0, max_tokens=48, stream=True) if chunk.choices]
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        calls = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
        message = answer.choices[0].message
        assert streamed.strip() == (message.content or "").strip()
        assert [c.function.name for c in calls] == [c.function.name for c in message.tool_calls or []]
        assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason
