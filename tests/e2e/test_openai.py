"""The OpenAI-compatible API on a real server, through the `openai` client unmodified: the bundled
SmolLM2-135M-Instruct chats (its chat template applied by the llm backend), streaming and not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from e2e.llm_server import MODEL, QUESTION, llm_server

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with llm_server(tmp_path_factory.mktemp("openai-repo")) as server:
        yield openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", timeout=60, max_retries=0)


def _ask(client: openai.OpenAI, stream: bool) -> Any:
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                          stream=stream)


def test_chat_answers_the_question(client: openai.OpenAI) -> None:
    completion = _ask(client, stream=False)
    assert completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert "Paris" in completion.choices[0].message.content


def test_streamed_chat_joins_to_the_same_answer(client: openai.OpenAI) -> None:
    whole = _ask(client, stream=False).choices[0].message.content
    chunks = list(_ask(client, stream=True))
    pieces = [chunk.choices[0].delta.content or "" for chunk in chunks]
    assert len([p for p in pieces if p]) > 1  # really streamed, not one piece
    assert "".join(pieces) == whole
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_of_a_raw_prompt_streamed_and_not(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = {"model": MODEL, "prompt": "The capital of France is", "temperature": 0,
                                "max_tokens": 5}
    whole = client.completions.create(**settings).choices[0].text
    assert whole
    assert "".join(chunk.choices[0].text for chunk in client.completions.create(**settings, stream=True)) == whole


def test_models_lists_the_llm_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert "no-such-model" in caught.value.message
    assert (caught.value.type, caught.value.code) == ("not_found_error", "model_not_found")  # OpenAI's error shape


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_temperature_is_a_bad_request(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=-1, stream=stream)
    assert "temperature" in caught.value.message


def test_unsupported_setting_is_a_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'n' is not supported"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, n=2)
