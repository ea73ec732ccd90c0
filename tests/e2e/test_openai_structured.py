"""Structured outputs through the `openai` client unmodified, on a real server with the bundled
SmolLM2: `chat.completions.parse` with a Pydantic model, `response_format` json_object streamed
and not, vLLM's guided_* fields (chat and completions, n > 1), and their bad forms as 400s."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from e2e.llm_server import MODEL, llm_client

pytestmark = pytest.mark.e2e

PERSON = [{"role": "user", "content": "Give me a person as a JSON object with a name and an age."}]


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=150)  # bounded: at temperature 1 unbounded digits could outrun max_tokens
    role: Literal["engineer", "artist", "doctor"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with llm_client(tmp_path_factory.mktemp("structured-repo")) as client:
        yield client


def test_parse_with_a_pydantic_model_returns_the_parsed_object(client: openai.OpenAI) -> None:
    for seed in range(3):
        answer = client.chat.completions.parse(model=MODEL, messages=PERSON, response_format=Person,
                                               temperature=1.0, seed=seed, max_tokens=64)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)


def test_json_object_is_a_json_object_streamed_or_not(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=PERSON, temperature=0, max_tokens=64,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    chunks = list(client.chat.completions.create(model=MODEL, messages=PERSON, temperature=0, max_tokens=64,
                                                 response_format={"type": "json_object"}, stream=True))
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == answer.choices[0].message.content


def test_guided_choice_and_regex_on_chat_and_completions_with_n(client: openai.OpenAI) -> None:
    choices = ["Paris", "London", "Rome"]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
                                          n=3, temperature=1.0, seed=1, extra_body={"guided_choice": choices})
    assert all(choice.message.content in choices and choice.finish_reason == "stop" for choice in chat.choices)
    completion = client.completions.create(model=MODEL, prompt="A date: ", n=2, temperature=1.0, max_tokens=16,
                                           extra_body={"guided_regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"})
    assert all(re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", choice.text) for choice in completion.choices)


def test_guided_json_and_grammar(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    answer = client.chat.completions.create(model=MODEL, messages=PERSON, temperature=1.0, max_tokens=32,
                                            extra_body={"guided_json": schema})
    assert set(json.loads(answer.choices[0].message.content or "")) == {"ok"}
    answer = client.completions.create(model=MODEL, prompt="Sum: ", temperature=1.0, max_tokens=32,
                                       extra_body={"guided_grammar": 'start: N "+" N\nN: /[1-9]/'})
    assert re.fullmatch(r"[1-9]\+[1-9]", answer.choices[0].text)


@pytest.mark.parametrize(("extra", "message"), [
    ({"response_format": {"type": "xml"}}, "must be text, json_object or json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
     "must be a JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}},
     "strict' must be true or false"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "format": 1}}}, "unknown field"),
    ({"response_format": "json"}, "must be an object with a 'type'"),
    ({"extra_body": {"guided_choice": []}}, "non-empty array"),
    ({"extra_body": {"guided_choice": ["a", 1]}}, "non-empty array"),
    ({"extra_body": {"guided_regex": ""}}, "non-empty string"),
    ({"extra_body": {"guided_regex": "(unclosed"}}, "regex cannot be used"),
    ({"extra_body": {"guided_grammar": "start: missing"}}, "grammar cannot be used"),
    ({"extra_body": {"guided_json": "not json"}}, "must be a JSON schema"),
    ({"extra_body": {"guided_json": {"type": "object"}, "guided_regex": "a"}}, "at most one of"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_choice": ["a"]}}, "at most one of"),
])
def test_bad_structured_output_fields_are_bad_requests(client: openai.OpenAI, extra: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=PERSON, max_tokens=4, **extra)
    assert message in caught.value.message
