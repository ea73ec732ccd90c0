"""The text-embedding pipeline of the example repository, served by a real naiad through tritonclient
over HTTP and gRPC: minilm_tokenizer (python) -> minilm_encoder (onnx) -> minilm_pooling (python),
each step on its own and as the minilm_embed ensemble.

The embeddings are checked against sentence-transformers run with torch (minilm_reference.json, made
by make_minilm_reference.py): cosine similarity above 0.999 for every sentence. Paraphrases must
score higher than unrelated sentences, and bad inputs must come back as clear errors.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads(Path(__file__).with_name("minilm_reference.json").read_text())
POOLING_DIR = ROOT / "examples" / "models" / "minilm_pooling" / "1"
CLIENTS = {"http": httpclient, "grpc": grpcclient}
PROTOCOLS = ["http", "grpc"]
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# Each pair says the same thing in other words; every cross pair between them is unrelated.
PARAPHRASES = [
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("Stock prices fell sharply today.", "Shares dropped steeply on the market today."),
]


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def tensor(protocol: str, name: str, array: np.ndarray, datatype: str) -> Any:
    made = CLIENTS[protocol].InferInput(name, list(array.shape), datatype)
    made.set_data_from_numpy(array)
    return made


def text_tensor(protocol: str, sentences: list[str] | list[bytes]) -> Any:
    raw = [s if isinstance(s, bytes) else s.encode("utf-8") for s in sentences]
    return tensor(protocol, "TEXT", np.array(raw, dtype=np.object_).reshape(-1, 1), "BYTES")


def embed_steps(server: ServerProcess, protocol: str, sentences: list[str]) -> np.ndarray:
    """The three steps called one after another by the client, as the ensemble does in the server."""
    c = client(server, protocol)
    tokens = c.infer("minilm_tokenizer", [text_tensor(protocol, sentences)])
    ids = {name: tokens.as_numpy(name) for name in TOKEN_INPUTS}
    hidden = c.infer("minilm_encoder", [tensor(protocol, n, ids[n], "INT64") for n in TOKEN_INPUTS])
    pooled = c.infer("minilm_pooling", [
        tensor(protocol, "TOKEN_EMBEDDINGS", hidden.as_numpy("last_hidden_state"), "FP32"),
        tensor(protocol, "ATTENTION_MASK", ids["attention_mask"], "INT64"),
    ])
    return pooled.as_numpy("EMBEDDING")


def embed_ensemble(server: ServerProcess, protocol: str, sentences: list[str]) -> np.ndarray:
    return client(server, protocol).infer("minilm_embed", [text_tensor(protocol, sentences)]).as_numpy("EMBEDDING")


EMBEDDERS = {"steps": embed_steps, "ensemble": embed_ensemble}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# --------------------------------------------------------------------------- correctness


def test_tokenizer_gives_the_reference_token_ids_padded_to_the_longest_rounded_up_to_8(
    example_server: ServerProcess,
) -> None:
    result = client(example_server, "http").infer("minilm_tokenizer", [text_tensor("http", REFERENCE["sentences"])])
    ids, mask, types = (result.as_numpy(n) for n in TOKEN_INPUTS)
    longest = -(-max(map(len, REFERENCE["input_ids"])) // 8) * 8
    assert ids.shape == mask.shape == types.shape == (3, longest)
    assert ids.dtype == np.int64
    for row, expected in enumerate(REFERENCE["input_ids"]):
        assert ids[row, : len(expected)].tolist() == expected
        assert mask[row].tolist() == [1] * len(expected) + [0] * (longest - len(expected))
        assert not ids[row, len(expected) :].any()
    assert not types.any()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("how", EMBEDDERS)
def test_embeddings_match_torch(example_server: ServerProcess, protocol: str, how: str) -> None:
    embeddings = EMBEDDERS[how](example_server, protocol, REFERENCE["sentences"])
    expected = np.array(REFERENCE["sentence_embedding"], np.float32)
    assert embeddings.shape == expected.shape == (3, 384) and embeddings.dtype == np.float32
    assert cosines(embeddings, expected).min() > 0.999
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("how", EMBEDDERS)
def test_one_sentence_alone_embeds_as_in_a_padded_batch(example_server: ServerProcess, how: str) -> None:
    """The shortest sentence is padded in the batch; its embedding must not change."""
    batch = EMBEDDERS[how](example_server, "grpc", REFERENCE["sentences"])
    alone = EMBEDDERS[how](example_server, "grpc", REFERENCE["sentences"][:1])
    np.testing.assert_allclose(alone[0], batch[0], atol=1e-5)


@pytest.mark.parametrize("how", EMBEDDERS)
def test_paraphrases_score_higher_than_unrelated_sentences(example_server: ServerProcess, how: str) -> None:
    left = [a for a, _ in PARAPHRASES]
    right = [b for _, b in PARAPHRASES]
    emb_left = EMBEDDERS[how](example_server, "http", left)
    emb_right = EMBEDDERS[how](example_server, "http", right)
    similarity = emb_left @ emb_right.T  # unit vectors: dot product = cosine
    paraphrase = np.diag(similarity)
    unrelated = similarity[~np.eye(len(PARAPHRASES), dtype=bool)]
    assert paraphrase.min() > unrelated.max(), similarity.round(3)
    assert paraphrase.min() > 0.5 and unrelated.max() < 0.3, similarity.round(3)


def test_pooling_function_matches_torch_and_ignores_padding() -> None:
    """The numpy pooling on the encoder's own output, in process (as the benchmark baseline uses it)."""
    sys.path.insert(0, str(POOLING_DIR))
    try:
        from pooling import mean_pool_normalize
    finally:
        sys.path.remove(str(POOLING_DIR))
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    pooled = mean_pool_normalize(hidden, mask)
    mean0 = hidden[0, :3].mean(axis=0)
    np.testing.assert_allclose(pooled[0], mean0 / np.linalg.norm(mean0), rtol=1e-5)
    assert np.all(mean_pool_normalize(hidden, np.zeros_like(mask)) == 0)  # no NaN for all-padding rows
    with pytest.raises(ValueError, match="does not match"):
        mean_pool_normalize(hidden, mask[:, :4])


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["minilm_tokenizer", "minilm_embed"])
def test_text_that_is_not_utf8_is_refused(example_server: ServerProcess, protocol: str, model: str) -> None:
    inputs = [text_tensor(protocol, [b"fine", b"\xff\xfe broken"])]
    with pytest.raises(InferenceServerException, match=r"TEXT\[1\] is not valid UTF-8"):
        client(example_server, protocol).infer(model, inputs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["minilm_tokenizer", "minilm_embed"])
def test_text_of_the_wrong_datatype_is_refused(example_server: ServerProcess, protocol: str, model: str) -> None:
    inputs = [tensor(protocol, "TEXT", np.ones((1, 1), np.int32), "INT32")]
    expected = f"inference input 'TEXT' data-type is 'INT32', but model '{model}' expects 'BYTES'"
    with pytest.raises(InferenceServerException, match=re.escape(expected)):
        client(example_server, protocol).infer(model, inputs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["minilm_tokenizer", "minilm_embed"])
def test_more_sentences_than_max_batch_size_are_refused(
        example_server: ServerProcess, protocol: str, model: str) -> None:
    inputs = [text_tensor(protocol, ["a sentence"] * 33)]
    expected = f"inference request batch-size must be <= 32 for '{model}'"
    with pytest.raises(InferenceServerException, match=re.escape(expected)):
        client(example_server, protocol).infer(model, inputs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pooling_refuses_a_mask_that_does_not_fit_the_tokens(example_server: ServerProcess, protocol: str) -> None:
    inputs = [
        tensor(protocol, "TOKEN_EMBEDDINGS", np.zeros((1, 4, 384), np.float32), "FP32"),
        tensor(protocol, "ATTENTION_MASK", np.ones((1, 3), np.int64), "INT64"),
    ]
    with pytest.raises(InferenceServerException, match=r"ATTENTION_MASK shape \[1, 3\] does not match"):
        client(example_server, protocol).infer("minilm_pooling", inputs)
