"""The llm backend's chat prompt (naiad.backends.llm_prompt) on small templates of its own: the
template controls, and tools rendered by a template that reads them or described in the system
message for one that does not, with earlier calls written back as text."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from naiad.backends.llm_prompt import chat_prompt
from naiad.backends.llm_request import RequestValues
from naiad.errors import InvalidArgument
from naiad.llm.loading.tokenizer import Tokenizer
from naiad.types import InferRequest

PLAIN = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}"
         "{% if add_generation_prompt %}<assistant>{% endif %}")
TOOL_AWARE = ("{% if tools %}[tools:{% for t in tools %}{{ t.function.name }};{% endfor %}]{% endif %}"
              "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
              "{% for c in m.tool_calls or [] %}(call {{ c.function.name }}){% endfor %}</>{% endfor %}")
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _prompt(template: str, messages: list[dict[str, object]], **parameters: object) -> str:
    tokenizer = Tokenizer(HFTokenizer(WordLevel({"x": 0}, unk_token="x")), template)
    values = RequestValues(InferRequest("m", None, [], parameters=dict(parameters)))
    return chat_prompt(tokenizer, json.dumps(messages), values)


def test_chat_template_kwargs_reach_the_template_and_continuing_cuts_after_the_last_message() -> None:
    template = "{% if thinking %}[think]{% endif %}" + PLAIN
    messages: list[dict[str, object]] = [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "Paris is"}]
    assert _prompt(template, messages) == "<user>hi</><assistant>Paris is</><assistant>"
    assert _prompt(template, messages, chat_template_kwargs='{"thinking": true}').startswith("[think]<user>")
    assert _prompt(template, messages, add_generation_prompt=False,
                   continue_final_message=True) == "<user>hi</><assistant>Paris is"
    with pytest.raises(InvalidArgument, match="may not set 'add_generation_prompt'"):
        _prompt(template, messages, chat_template_kwargs='{"add_generation_prompt": false}')
    with pytest.raises(InvalidArgument, match="may not set 'tools'"):
        _prompt(template, messages, chat_template_kwargs='{"tools": []}')


def test_a_template_that_reads_tools_renders_them_and_the_calls_itself() -> None:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = _prompt(TOOL_AWARE, messages, tools=json.dumps([WEATHER]))
    assert prompt == "[tools:weather;]<user>Weather in Paris?</><assistant>(call weather)</><tool>sunny</>"


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = _prompt(PLAIN, messages, tools=json.dumps([WEATHER]))
    system = prompt[len("<system>"): prompt.index("</>")]
    assert system.startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER["function"]) in system and "<tool_call>" in system
    assert ('<assistant><tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call></>'
            '<tool>sunny</><assistant>') in prompt
    assert _prompt(PLAIN, messages[1:2], tools=json.dumps([WEATHER])).startswith("<system># Tools")


def test_bad_tools_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgument, match="'tools' must be a JSON array"):
        _prompt(PLAIN, [{"role": "user", "content": "x"}], tools='{"a": 1}')
    with pytest.raises(InvalidArgument, match="needs a 'function'"):
        _prompt(PLAIN, [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}])
