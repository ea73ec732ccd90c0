"""The OpenAI frontend's request parsing and answer shapes, without a server or a model."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from naiad.errors import InternalError, InvalidArgument
from naiad.frontends.http.openai import _Call
from naiad.frontends.http.openai_answers import Choice, usage

MODEL = "m"


class _Server:
    def __init__(self, parameters: dict[str, str] | None = None) -> None:
        self.parameters = {key: SimpleNamespace(string_value=value) for key, value in (parameters or {}).items()}

    def repository_index(self, ready_only: bool) -> list[dict[str, str]]:
        return [{"name": MODEL}]

    def model_config_message(self, name: str, version: int | None) -> Any:
        return SimpleNamespace(backend="llm", parameters=self.parameters)


def _call(chat: bool = True, server: _Server | None = None, **body: Any) -> _Call:
    base: dict[str, Any] = {"model": MODEL}
    base.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    return _Call.parse(server or _Server(), {**base, **body}, chat)  # type: ignore[arg-type]


def test_settings_become_backend_parameters() -> None:
    call = _call(stop="\n", n=3, seed=7, presence_penalty=0.5, repetition_penalty=1.2, logprobs=True,
                 top_logprobs=4, user="someone", max_completion_tokens=9)
    assert len(call.requests) == 3
    parameters = call.requests[0].parameters
    assert json.loads(parameters["stop"]) == ["\n"]
    assert parameters["presence_penalty"] == 0.5 and parameters["repetition_penalty"] == 1.2
    assert parameters["logprobs"] == 4 and parameters["max_tokens"] == 9
    assert parameters["return_finish_reason"] and parameters["return_num_tokens"]
    assert "user" not in parameters
    assert [request.parameters["seed"] for request in call.requests] == [7, 8, 9]
    controls = _call(logit_bias={"12": -100}, include_stop_str_in_output=True, add_generation_prompt=False,
                     continue_final_message=True, chat_template_kwargs={"enable_thinking": False})
    parameters = controls.requests[0].parameters
    assert json.loads(parameters["logit_bias"]) == {"12": -100} and parameters["include_stop_str_in_output"] is True
    assert parameters["add_generation_prompt"] is False and parameters["continue_final_message"] is True
    assert json.loads(parameters["chat_template_kwargs"]) == {"enable_thinking": False}


@pytest.mark.parametrize(("chat", "body", "message"), [
    (True, {"tools": [{"type": "function"}]}, "'tools[0]' must be"),
    (True, {"tool_choice": "required"}, "'tool_choice'"),
    (True, {"response_format": {"type": "json_schema"}}, "needs a 'json_schema' object"),
    (False, {"echo": "yes"}, "'echo' must be true or false"),
    (False, {"suffix": "x"}, "'suffix'"),
    (False, {"best_of": 2}, "'best_of'"),
    (True, {"logit_bias": [3, 1]}, "'logit_bias' must be an object"),
    (True, {"frobnicate": 1}, "unknown field 'frobnicate'"),
    (False, {"top_logprobs": 2}, "unknown field 'top_logprobs'"),  # chat only
    (True, {"stop": ["a", "b", "c", "d", "e"]}, "up to 4"),
    (True, {"stop": [""]}, "'stop' must be"),
    (True, {"n": 129}, "'n' must be"),
    (False, {"logprobs": 21}, "'logprobs' must be"),
    (True, {"logprobs": 2}, "'logprobs' must be true or false"),
    (True, {"stream": True, "stream_options": {"other": 1}}, "only 'include_usage'"),
])
def test_unsupported_and_bad_fields_are_refused(chat: bool, body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _call(chat, **body)
    assert message in caught.value.message


def test_harmless_values_of_refused_fields_pass() -> None:
    _call(tools=[], tool_choice="none", response_format={"type": "text"}, logit_bias={}, parallel_tool_calls=True)
    _call(False, echo=False, suffix=None, best_of=1)


ENTRIES = [
    {"id": 5, "token": "Par", "logprob": -0.25, "bytes": [80, 97, 114],
     "top": [{"id": 5, "token": "Par", "logprob": -0.25, "bytes": [80, 97, 114]},
             {"id": 6, "token": "Lon", "logprob": -2.0, "bytes": [76, 111, 110]}]},
    {"id": 7, "token": "is", "logprob": -3.0, "bytes": [105, 115],
     "top": [{"id": 8, "token": ".", "logprob": -0.1, "bytes": [46]}]},
]


def test_chat_logprobs_shape() -> None:
    call = _call(logprobs=True, top_logprobs=1)
    choice = call.completion([Choice("Paris", "length", 4, 2, ENTRIES)])["choices"][0]
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == ["Par", "is"]
    assert content[1]["top_logprobs"] == [{"token": ".", "logprob": -0.1, "bytes": [46]}]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "Paris"


def test_completion_logprobs_shape_includes_the_sampled_token_and_offsets() -> None:
    call = _call(False, logprobs=1)
    logprobs = call.completion([Choice("Paris", "stop", 4, 2, ENTRIES)])["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Par", "is"] and logprobs["token_logprobs"] == [-0.25, -3.0]
    assert logprobs["top_logprobs"] == [{"Par": -0.25, "Lon": -2.0}, {".": -0.1, "is": -3.0}]
    assert logprobs["text_offset"] == [0, 3]
    chunk = call.chunk(0, "is", ENTRIES[1:], 3)
    assert chunk["choices"][0]["logprobs"]["text_offset"] == [3]


def test_usage_counts_the_prompt_once_and_sums_the_completions() -> None:
    choices = [Choice(prompt_tokens=10, completion_tokens=3, cached_tokens=4),
               Choice(prompt_tokens=10, completion_tokens=5, cached_tokens=4)]
    assert usage(choices, 2) == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                                  "prompt_tokens_details": {"cached_tokens": 4}}


def test_no_logprobs_unless_asked() -> None:
    body = _call().completion([Choice("x", "stop", 1, 1, ENTRIES)])
    assert body["choices"][0]["logprobs"] is None
    assert "logprobs" not in _call().requests[0].parameters


def test_content_as_text_parts_is_joined_by_newlines() -> None:
    call = _call(messages=[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                           {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    sent = call.requests[0].inputs[0].data[0].decode()
    assert json.loads(sent) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]


@pytest.mark.parametrize(("content", "message"), [
    ([{"type": "image_url", "image_url": {"url": "data:,"}}], "parts of type 'image_url' are not supported"),
    ([{"type": "text"}], "needs a string 'text'"),
    ([], "non-empty array of parts"),
    (None, "must be a string or a non-empty array"),
    (["plain"], "parts of type 'str'"),
])
def test_bad_content_parts_are_refused(content: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _call(messages=[{"role": "user", "content": content}])
    assert message in caught.value.message and "messages[0]" in caught.value.message


def test_a_batch_of_prompts_orders_choices_by_prompt_then_n() -> None:
    call = _call(False, prompt=["one", "two"], n=2, seed=3)
    texts = [request.inputs[0].data[0].decode() for request in call.requests]
    assert texts == ["one", "one", "two", "two"]
    assert [request.parameters["seed"] for request in call.requests] == [3, 4, 3, 4]
    usage = call.completion([Choice("x", "stop", 5, 1), Choice("y", "stop", 5, 2),
                             Choice("z", "stop", 7, 3), Choice("w", "stop", 7, 4)])["usage"]
    assert usage == {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22,
                     "prompt_tokens_details": {"cached_tokens": 0}}


def test_prompts_as_token_ids_go_to_the_backend_as_they_are() -> None:
    one = _call(False, prompt=[1, 2, 3]).requests
    assert len(one) == 1 and json.loads(one[0].parameters["prompt_token_ids"]) == [1, 2, 3]
    assert one[0].inputs[0].data[0] == b""
    batch = _call(False, prompt=[[1, 2], [3]], n=2).requests
    assert [json.loads(r.parameters["prompt_token_ids"]) for r in batch] == [[1, 2], [1, 2], [3], [3]]


@pytest.mark.parametrize(("prompt", "message"), [
    ([], "non-empty array of either"),
    (["a", 1], "non-empty array of either"),
    ([1, -2], "non-empty array of either"),
    ([[1, 2], []], "non-empty array of either"),
    ([[1], "a"], "non-empty array of either"),
    ([True], "non-empty array of either"),
    (["a"] * 20, "more than 2048 choices"),
])
def test_bad_prompts_are_refused(prompt: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _call(False, prompt=prompt, n=128 if len(prompt) == 20 else 1)
    assert message in caught.value.message


def test_a_model_with_a_reasoning_parser_answers_with_reasoning_content() -> None:
    call = _call(server=_Server({"reasoning_parser": "qwen3"}))
    message = call.completion([Choice("<think>France.</think>Paris.", "stop", 4, 2)])["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "France."}
    plain = call.completion([Choice("Paris.", "stop", 4, 2)])["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": "Paris.", "reasoning_content": None}
    assert call.chunk(0, "", [], 0, reasoning="Fra")["choices"][0]["delta"] == {"role": "assistant",
                                                                                "reasoning_content": "Fra"}
    assert call.chunk(0, "Par", [], 0)["choices"][0]["delta"] == {"role": "assistant", "content": "Par"}
    without = _call().completion([Choice("<think>x</think>y", "stop", 1, 1)])["choices"][0]["message"]
    assert without == {"role": "assistant", "content": "<think>x</think>y"}  # no parser: the text as it is
    assert _call(False, server=_Server({"reasoning_parser": "qwen3"})).thinks_first is None  # chats only


def test_an_unknown_reasoning_parser_is_an_internal_error() -> None:
    with pytest.raises(InternalError, match="unknown reasoning_parser"):
        _call(server=_Server({"reasoning_parser": "nope"}))
