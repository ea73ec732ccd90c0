"""The README's retrieval flow against one server holding what `make serve` holds (the example
repository and the bundled SmolLM2), through the clients a RAG app uses: langchain-openai's
OpenAIEmbeddings embeds the documents and the question, `/v1/rerank` (Jina's / Cohere's shape)
orders the documents, and langchain-openai's ChatOpenAI answers from the best one."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, ServerProcess, running_server
from e2e.llm_server import wait_model_ready
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

pytestmark = pytest.mark.e2e

DOCUMENTS = [
    "The Eiffel Tower is in Paris, the capital of France.",
    "Bananas are rich in potassium.",
    "The Great Wall of China is thousands of kilometres long.",
]
QUESTION = "Which city is the Eiffel Tower in?"


@pytest.fixture(scope="module")
def server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`make serve`'s two repositories, every model loaded."""
    log = tmp_path_factory.mktemp("rag") / "naiad.log"
    with running_server(["--model-repository", str(example_repo), "--model-repository", str(EXAMPLES / "llm"),
                         "--model-control-mode=explicit", "--load-model=*"], log) as started:
        wait_model_ready(started)
        yield started


def test_embed_rerank_and_chat_on_one_server(server: ServerProcess) -> None:
    base = f"http://{server.url}/v1"
    # OpenAI's tokenizer counts cannot apply to another model: send the texts as they are.
    embedder = OpenAIEmbeddings(model="minilm_embed", base_url=base, api_key="unused",
                                check_embedding_ctx_length=False)
    documents = np.array(embedder.embed_documents(DOCUMENTS))
    question = np.array(embedder.embed_query(QUESTION))
    assert documents.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(documents, axis=1), 1.0, atol=1e-5)
    assert int(np.argmax(documents @ question)) == 0  # retrieval by cosine finds the Eiffel Tower

    body = json.dumps({"model": "minilm_embed", "query": QUESTION, "documents": DOCUMENTS, "top_n": 2}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/rerank", body, method="POST"), timeout=60) as answer:
        ranked = json.loads(answer.read())["results"]
    assert [r["index"] for r in ranked] == [0, int(np.argsort(-(documents @ question))[1])]
    assert ranked[0]["relevance_score"] >= ranked[1]["relevance_score"]

    chat = ChatOpenAI(model="smollm2", base_url=base, api_key="unused", temperature=0, max_tokens=20)
    context = DOCUMENTS[ranked[0]["index"]]
    reply = chat.invoke([("system", f"Answer from this text: {context}"), ("user", QUESTION)])
    assert "Paris" in reply.content
