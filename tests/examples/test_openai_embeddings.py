"""`POST /v1/embeddings` against the example repository through the unmodified `openai` client:
the `minilm_embed` ensemble's vectors, equal to sentence-transformers' (minilm_reference.json) and
to what the KServe V2 route returns; base64, `dimensions`, token usage, batches larger than the
model's, `/v1/models`, and clear errors."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import ServerProcess
from examples.test_embeddings_pipeline import cosines, embed_ensemble

pytestmark = pytest.mark.e2e

REFERENCE = json.loads(Path(__file__).with_name("minilm_reference.json").read_text())
MODEL = "minilm_embed"


@pytest.fixture(scope="module")
def client(example_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{example_server.url}/v1", api_key="unused", timeout=60, max_retries=0)


def test_vectors_match_sentence_transformers_and_the_kserve_route(client: openai.OpenAI,
                                                                    example_server: ServerProcess) -> None:
    answer = client.embeddings.create(model=MODEL, input=REFERENCE["sentences"])
    vectors = np.array([item.embedding for item in answer.data], np.float32)
    assert [item.index for item in answer.data] == [0, 1, 2] and answer.model == MODEL
    assert cosines(vectors, np.array(REFERENCE["sentence_embedding"], np.float32)).min() > 0.999
    np.testing.assert_allclose(vectors, embed_ensemble(example_server, "http", REFERENCE["sentences"]), atol=1e-6)
    # the tokens each sentence had, [CLS] and [SEP] included
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(map(len, REFERENCE["input_ids"]))


def test_base64_carries_the_same_floats(client: openai.OpenAI) -> None:
    floats = client.embeddings.create(model=MODEL, input="A man is eating food.").data[0].embedding
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="A man is eating food.",
                                                    encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), "<f4").tolist() == np.float32(floats).tolist()


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI) -> None:
    whole = np.array(client.embeddings.create(model=MODEL, input="The cat naps.").data[0].embedding)
    short = np.array(client.embeddings.create(model=MODEL, input="The cat naps.", dimensions=64).data[0].embedding)
    assert short.shape == (64,)
    np.testing.assert_allclose(np.linalg.norm(short), 1.0, atol=1e-5)
    np.testing.assert_allclose(short, whole[:64] / np.linalg.norm(whole[:64]), atol=1e-5)


def test_more_texts_than_the_model_batches_at_once(client: openai.OpenAI, example_server: ServerProcess) -> None:
    texts = [f"Sentence number {i} is about {['cats', 'stocks', 'rain'][i % 3]}." for i in range(70)]  # 32 + 32 + 6
    vectors = np.array([item.embedding for item in client.embeddings.create(model=MODEL, input=texts).data])
    assert vectors.shape == (70, 384)
    np.testing.assert_allclose(vectors[[0, 40, 69]], embed_ensemble(example_server, "http",
                                                                    [texts[0], texts[40], texts[69]]), atol=1e-5)


def test_models_lists_the_embedding_model_with_its_task(client: openai.OpenAI) -> None:
    listed = {model.id: model for model in client.models.list().data}
    assert getattr(listed[MODEL], "task", None) == "embedding"
    assert "minilm_encoder" not in listed  # token ids in, hidden states out: not an embedder


@pytest.mark.parametrize(("settings", "status", "message"), [
    ({"model": "nope", "input": "x"}, 404, "'nope' does not exist"),
    ({"model": "minilm_encoder", "input": "x"}, 400, "does not serve embeddings"),
    ({"model": MODEL, "input": [101, 2023, 102]}, 400, "token ids is not supported"),
    ({"model": MODEL, "input": "x", "dimensions": 1000}, 400, "from 1 to 384"),
])
def test_bad_requests_get_openai_errors(client: openai.OpenAI, settings: dict, status: int, message: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(**settings)
    assert caught.value.status_code == status and message in caught.value.message


def _post(server: ServerProcess, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{server.url}{path}", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


DOCUMENTS = ["Shares dropped steeply on the market today.", "A cat naps on the couch.",
             "I forgot my password, how can I change it?"]


def test_rerank_puts_the_paraphrase_first(example_server: ServerProcess) -> None:
    """Jina's / Cohere's shape (documents as strings or {"text"}), scored by the embeddings' cosine."""
    status, answer = _post(example_server, "/v1/rerank", {
        "model": MODEL, "query": "How do I reset my password?", "top_n": 2,
        "documents": [DOCUMENTS[0], {"text": DOCUMENTS[1]}, DOCUMENTS[2]]})
    assert status == 200, answer
    assert [r["index"] for r in answer["results"]][:1] == [2] and len(answer["results"]) == 2
    assert answer["results"][0]["document"] == {"text": DOCUMENTS[2]}
    assert answer["results"][0]["relevance_score"] > answer["results"][1]["relevance_score"]
    vectors = embed_ensemble(example_server, "http", ["How do I reset my password?", DOCUMENTS[2]])
    assert abs(answer["results"][0]["relevance_score"] - float(vectors[0] @ vectors[1])) < 1e-5
    assert answer["usage"]["total_tokens"] > 0
    status, bare = _post(example_server, "/v1/rerank", {"model": MODEL, "query": "cats", "documents": DOCUMENTS,
                                                         "return_documents": False})
    assert status == 200 and "document" not in bare["results"][0] and len(bare["results"]) == 3


def test_cohere_and_jina_clients_rerank(example_server: ServerProcess) -> None:
    """Cohere's own SDK, unmodified (its v2 client posts to /v2/rerank, its v1 client to
    /v1/rerank), and Jina's path /rerank, all served by the same scorer."""
    import cohere

    query = "How do I reset my password?"
    v2 = cohere.ClientV2(base_url=f"http://{example_server.url}", api_key="unused")
    answer = v2.rerank(model=MODEL, query=query, documents=DOCUMENTS, top_n=2)
    assert answer.results[0].index == 2  # the paraphrase first
    assert len(answer.results) == 2 and answer.results[0].relevance_score > answer.results[1].relevance_score
    v1 = cohere.Client(base_url=f"http://{example_server.url}", api_key="unused")
    assert v1.rerank(model=MODEL, query=query, documents=DOCUMENTS).results[0].index == 2
    status, jina = _post(example_server, "/rerank", {"model": MODEL, "query": query, "documents": DOCUMENTS})
    assert status == 200 and jina["results"][0]["index"] == 2


def test_score_one_against_many_and_pairs(example_server: ServerProcess) -> None:
    status, one = _post(example_server, "/v1/score", {"model": MODEL, "text_1": "A cat sleeps.", "text_2": DOCUMENTS})
    assert status == 200, one
    scores = [item["score"] for item in one["data"]]
    assert scores.index(max(scores)) == 1 and [item["index"] for item in one["data"]] == [0, 1, 2]
    status, pairs = _post(example_server, "/v1/score", {"model": MODEL, "text_1": ["A cat sleeps.", "Stocks fell."],
                                                        "text_2": [DOCUMENTS[1], DOCUMENTS[0]]})
    assert status == 200 and all(item["score"] > 0.5 for item in pairs["data"]), pairs


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": []}, 400, "'documents' must be a non-empty array"),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a"], "top_n": 0}, 400, "'top_n'"),
    ("/v1/rerank", {"model": "minilm_encoder", "query": "q", "documents": ["a"]}, 400, "not an embedding model"),
    ("/v1/score", {"model": MODEL, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "as many as text_2"),
    ("/v1/score", {"model": "nope", "text_1": "a", "text_2": "b"}, 404, "does not exist"),
])
def test_bad_scoring_requests(example_server: ServerProcess, path: str, body: dict, status: int, message: str) -> None:
    got, answer = _post(example_server, path, body)
    assert got == status and message in answer["error"]["message"], answer
