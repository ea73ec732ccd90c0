"""reasoning_content through the `openai` client unmodified, on a real server whose SmolLM2 is
configured with vLLM's "deepseek_r1" reasoning parser: the template is taken to have opened
`<think>`, so an answer without `</think>` (SmolLM2 never writes one) is all reasoning."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from e2e.llm_server import MODEL, QUESTION, llm_client

pytestmark = pytest.mark.e2e

PARSER = 'parameters { key: "reasoning_parser" value: { string_value: "deepseek_r1" } }\n'


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with llm_client(tmp_path_factory.mktemp("reasoning-repo"), PARSER) as client:
        yield client


def test_an_answer_without_the_closing_tag_is_all_reasoning_streamed_or_not(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    message = answer.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert "Paris" in reasoning and message.content == ""
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,
                                                 stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join((delta.model_extra or {}).get("reasoning_content") or "" for delta in deltas) == reasoning
    assert not any(delta.content for delta in deltas)
