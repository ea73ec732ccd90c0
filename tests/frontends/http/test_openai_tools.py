"""Function calling's request checks and answer parsing (naiad.frontends.http.openai_tools),
without a server: the calls found in answers, the grammar of forced calls, the argument checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from naiad.errors import InvalidArgument
from naiad.frontends.http.openai_tools import check_arguments, parse_tools

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}


def _tools(**body: Any) -> Any:
    tools = parse_tools({"tools": [WEATHER, CLOCK], **body})
    assert tools is not None
    return tools


def _arguments(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls]


def test_auto_finds_hermes_calls_and_keeps_the_text_around_them() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "clock", "arguments": {}}</tool_call>')
    content, calls = _tools().split(text)
    assert content == "Let me check."
    assert _arguments(calls) == [("weather", {"city": "Paris"}), ("clock", {})]
    assert all(call["id"].startswith("call_") and call["type"] == "function" for call in calls)


def test_auto_takes_a_llama_style_answer_and_arguments_given_as_a_string() -> None:
    content, calls = _tools().split('{"name": "weather", "parameters": {"city": "Oslo", "days": 2}}')
    assert content is None and _arguments(calls) == [("weather", {"city": "Oslo", "days": 2})]
    _, calls = _tools().split('<tool_call>{"name": "weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>')
    assert _arguments(calls) == [("weather", {"city": "Rome"})]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',  # not offered
    '<tool_call>{"name": "weather", "arguments": {"days": 2}}</tool_call>',  # city is required
    '<tool_call>{"name": "weather", "arguments": {"city": 3}}</tool_call>',  # not a string
    '<tool_call>{"name": "weather", "arguments": {"city": "x", "when": 1}}</tool_call>',  # no such property
    '<tool_call>{"name": "weather", "arguments": {"city": "x"</tool_call>',  # broken JSON
    '{"answer": 42}',
    "Just text.",
])
def test_auto_leaves_what_is_not_a_valid_call_as_text(text: str) -> None:
    assert _tools().split(text) == (text, [])


def test_forced_calls_are_generated_under_a_grammar_and_parsed_from_its_array() -> None:
    required = _tools(tool_choice="required").backend_parameters()
    schema = json.loads(required["guided_json"])
    assert schema["minItems"] == 1 and "maxItems" not in schema
    assert [option["properties"]["name"]["const"] for option in schema["items"]["anyOf"]] == ["weather", "clock"]
    assert json.loads(required["tools"]) == [WEATHER, CLOCK]
    named = _tools(tool_choice={"type": "function", "function": {"name": "weather"}}, parallel_tool_calls=False)
    schema = json.loads(named.backend_parameters()["guided_json"])
    assert schema["maxItems"] == 1 and schema["items"]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    content, calls = named.split('[{"name":"weather","arguments":{"city":"Lima"}}]')
    assert content is None and _arguments(calls) == [("weather", {"city": "Lima"})]
    assert named.split('[{"name":"weather","argu') == ('[{"name":"weather","argu', [])  # cut by max_tokens
    assert "guided_json" not in _tools().backend_parameters()


def test_no_tools_or_tool_choice_none_means_no_function_calling() -> None:
    assert parse_tools({}) is None
    assert parse_tools({"tools": [], "tool_choice": "auto"}) is None
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}) is None


@pytest.mark.parametrize(("body", "message"), [
    ({"tools": {"a": 1}}, "'tools' must be an array"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "must be a JSON schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "'tool_choice' must be"),
])
def test_bad_tool_requests_are_invalid_arguments(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_tools(body)


def test_argument_checks() -> None:
    schema = {"type": "object", "properties": {"n": {"type": ["integer", "null"]}, "tags": {
        "type": "array", "items": {"enum": ["a", "b"]}}, "flag": {"type": "boolean"}, "v": {"const": 1}}}
    assert check_arguments({"n": None, "tags": ["a"], "flag": True, "v": 1}, schema)
    assert not check_arguments({"n": True}, schema)  # a boolean is no integer
    assert not check_arguments({"tags": ["c"]}, schema)
    assert not check_arguments({"flag": 1}, schema)
    assert not check_arguments({"v": 2}, schema)
    assert not check_arguments([], schema)


def _stream(pieces: list[str]) -> tuple[str, str | None, list[dict[str, Any]]]:
    from naiad.frontends.http.openai_tools import CallWatch

    watch = CallWatch(_tools())
    out = "".join(watch.push(piece) for piece in pieces)
    content, calls = watch.finish()
    return out, content, calls


def test_streamed_auto_text_goes_out_as_it_comes_until_a_call_may_begin() -> None:
    out, content, calls = _stream(["The weather ", "is fine <", "b>today</b>."])
    assert out == "The weather is fine <b>today</b>." and content == "" and calls == []
    out, content, calls = _stream(["Let me check. <tool", '_call>{"name": "clock", "arguments": {}}', "</tool_call>"])
    assert out == "Let me check. " and content is None and _arguments(calls) == [("clock", {})]
    out, content, calls = _stream(["  ", '{"name": "weather", ', '"parameters": {"city": "Oslo"}}'])
    assert out == "" and _arguments(calls) == [("weather", {"city": "Oslo"})]
    out, content, calls = _stream(["{not a call}", " and more"])  # held, then given back whole
    assert out == "" and content == "{not a call} and more" and calls == []
    out, content, _ = _stream(["ends with <tool_"])
    assert out == "ends with " and content == "<tool_"
