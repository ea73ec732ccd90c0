"""Embeddings from the LLM engine (issue 25's LLM pooling): the bundled SmolLM2, configured with
`pooling`, serves /v1/embeddings through the `openai` client beside its chat, its texts batched
with the engine's continuous batching."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openai
import pytest

from e2e.llm_server import MODEL, QUESTION, llm_client

pytestmark = pytest.mark.e2e

POOLING = 'parameters { key: "pooling" value: { string_value: "mean" } }\n'
TEXTS = ["A man is eating food.", "A cat naps on the couch.", "Stocks fell sharply today."]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with llm_client(tmp_path_factory.mktemp("pooling-repo"), POOLING) as client:
        yield client


def test_the_llm_embeds_and_chats_on_one_model(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model=MODEL, input=TEXTS)
    vectors = np.array([item.embedding for item in answer.data])
    assert vectors.shape == (3, 576)  # SmolLM2-135M's hidden size
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert answer.usage.prompt_tokens > len(TEXTS)
    alone = np.array(client.embeddings.create(model=MODEL, input=TEXTS[1]).data[0].embedding)
    assert float(alone @ vectors[1]) > 0.9999  # the same vector, batched with others or not
    assert float(vectors[0] @ vectors[2]) < 0.9999  # and different texts differ
    short = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=64).data[0].embedding
    assert len(short) == 64 and abs(np.linalg.norm(short) - 1) < 1e-4
    listed = {model.id: model.model_extra.get("task") for model in client.models.list()}
    assert listed[MODEL] == "generate,embedding"
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=8)
    assert "Paris" in (chat.choices[0].message.content or "")
