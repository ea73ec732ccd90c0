"""`POST /v1/rerank` (Jina's and Cohere's shape, as vLLM and llama.cpp serve it; also at `/rerank`
and at `/v2/rerank`, where Cohere's v2 SDK posts) and
`POST /v1/score` (vLLM's) over an embedding model: a query (or `text_1`) against documents (or
`text_2`), scored by the cosine of their vectors, the texts embedded in one call through the
model's batcher (openai_embeddings).

A cross-encoder scores a pair better than the cosine of two separate embeddings; no cross-encoder
ships in a PyPI wheel to serve here, so embedding models are what these endpoints take.

Rerank: `{"model", "query", "documents": [str | {"text": str}], "top_n", "return_documents"}` →
`{"id", "model", "usage": {"total_tokens"}, "results": [{"index", "relevance_score", "document":
{"text"}}]}`, best first, `top_n` of them (all by default), documents returned unless
`return_documents` is false. Score: `{"model", "text_1": str | [str], "text_2": str | [str]}` →
`{"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}],
"usage"}`: one text_1 against each text_2, or pairs of equal-length lists.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InvalidArgument, NaiadError
from naiad.frontends.http.openai import parse_body
from naiad.frontends.http.openai_answers import openai_error
from naiad.frontends.http.openai_embeddings import MAX_INPUTS, embed
from naiad.frontends.http.openai_tasks import Embedder, check_fields, require_embedder
from naiad.frontends.http.reply import Headers, Reply
from naiad.frontends.http.routes import Route

_RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "user"}
_SCORE_FIELDS = {"model", "text_1", "text_2", "user"}
_encoder = msgspec.json.Encoder()


async def rerank(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))  # a model that loads on demand, before it is looked up
        check_fields(document, _RERANK_FIELDS)
        model = _model(server, document.get("model"))
        query = _text(document.get("query"), "query")
        documents = _documents(document.get("documents"))
        top_n = document.get("top_n", len(documents))
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise InvalidArgument(f"'top_n' must be a positive integer, got {top_n!r}")
        returned = document.get("return_documents", True)
        if not isinstance(returned, bool):
            raise InvalidArgument(f"'return_documents' must be true or false, got {returned!r}")
        vectors, tokens = await embed(server, model, [query, *documents], headers)
        scores = _cosines(vectors[0:1], vectors[1:])
        order = np.argsort(-scores, kind="stable")[:top_n]
        results = []
        for index in order.tolist():
            result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
            if returned:
                result["document"] = {"text": documents[index]}
            results.append(result)
        return Reply(200, _encoder.encode({"id": f"rerank-{uuid.uuid4().hex}", "model": model.name,
                                           "usage": {"total_tokens": tokens}, "results": results}))
    except NaiadError as error:
        return openai_error(error)


async def score(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))  # a model that loads on demand, before it is looked up
        check_fields(document, _SCORE_FIELDS)
        model = _model(server, document.get("model"))
        first, second = _texts(document.get("text_1"), "text_1"), _texts(document.get("text_2"), "text_2")
        if len(first) != 1 and len(first) != len(second):
            raise InvalidArgument(f"'text_1' holds {len(first)} texts and 'text_2' {len(second)}: give one "
                                  "text_1, or as many as text_2 (pairs)")
        if len(first) + len(second) > MAX_INPUTS:
            raise InvalidArgument(f"more than {MAX_INPUTS} texts in one call")
        vectors, tokens = await embed(server, model, [*first, *second], headers)
        left, right = vectors[: len(first)], vectors[len(first):]
        scores = _cosines(left, right) if len(first) == 1 else _pairwise(left, right)
        data = [{"index": index, "object": "score", "score": float(value)} for index, value in enumerate(scores)]
        return Reply(200, _encoder.encode({
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model.name,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    except NaiadError as error:
        return openai_error(error)


def _model(server: InferenceServer, name: Any) -> Embedder:
    return require_embedder(server, name, f"The model '{name}' cannot score texts: it is not an embedding model")


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"'{key}' must be a non-empty string")
    return value


def _texts(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgument(f"'{key}' must be a non-empty string or a non-empty array of them")
    return value


def _documents(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidArgument("'documents' must be a non-empty array")
    if len(value) >= MAX_INPUTS:
        raise InvalidArgument(f"'documents' holds {len(value)} texts, more than {MAX_INPUTS - 1}")
    texts = []
    for item in value:
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text:
            raise InvalidArgument("each document must be a non-empty string or an object with a 'text' string")
        texts.append(text)
    return texts


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def _cosines(query: np.ndarray, others: np.ndarray) -> np.ndarray:
    """The cosine of one vector `[1, d]` with each of `others` `[n, d]`."""
    scores: np.ndarray = (_unit(others) @ _unit(query)[0]).astype(np.float64)
    return scores


def _pairwise(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    scores: np.ndarray = np.sum(_unit(left) * _unit(right), axis=1).astype(np.float64)
    return scores
