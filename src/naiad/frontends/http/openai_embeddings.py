"""`POST /v1/embeddings` over any repository model that turns text into a vector: an ONNX or
Python model, or an ensemble (the example `minilm_embed`), through the same inference path as
KServe V2 requests (its dynamic batcher, metrics, tracing and limits).

A model serves embeddings when its config says so, `parameters { key: "openai_task" value:
{ string_value: "embedding" } }`, or when its shape leaves no doubt: one BYTES (TYPE_STRING)
input of dims [1] and one FP32 output of one dimension (a vector per text). Its config may name
an integer output holding each text's token count (`openai_tokens_output`), which makes
`usage.prompt_tokens`; without one the usage says 0 tokens (the model reports none).

The request follows OpenAI's: `input` a string or an array of strings (token ids are a 400: the
model tokenizes), `encoding_format` "float" or "base64" (little-endian float32 bytes, as
OpenAI), `dimensions` (the first N values, L2-normalised again: Matryoshka truncation), `user`
ignored. Texts beyond the model's max_batch_size go as several requests at once, which the
model's dynamic batcher may batch again.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError
from naiad.frontends.http.openai import parse_body
from naiad.frontends.http.openai_answers import openai_error
from naiad.frontends.http.openai_tasks import Embedder, check_fields, require_embedder
from naiad.frontends.http.reply import Headers, Reply
from naiad.frontends.http.routes import Route
from naiad.frontends.http.tracing import carry_trace
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

MAX_INPUTS = 2048  # as OpenAI
_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
_encoder = msgspec.json.Encoder()


async def embeddings(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))  # a model that loads on demand, before it is looked up
        model, texts, encoding, dimensions = _parse(server, document)
        vectors, tokens = await embed(server, model, texts, headers)
        if dimensions is not None and dimensions < model.size:
            vectors = vectors[:, :dimensions]
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0, norms, 1.0)
        data = [{"object": "embedding", "index": index, "embedding": _encode(vector, encoding)}
                for index, vector in enumerate(vectors)]
        answer = {"object": "list", "data": data, "model": model.name,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Reply(200, _encoder.encode(answer))
    except NaiadError as error:
        return openai_error(error)


def _parse(server: InferenceServer, body: dict[str, Any]) -> tuple[Embedder, list[str], str, int | None]:
    check_fields(body, _FIELDS)
    name = body.get("model")
    model = require_embedder(server, name, f"The model '{name}' does not serve embeddings (it is not a "
                             "text-to-vector model; a config may say so with the parameter openai_task: embedding)")
    texts = _texts(body.get("input"))
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidArgument(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= model.size):
        raise InvalidArgument(f"'dimensions' must be an integer from 1 to {model.size} for '{name}', "
                              f"got {dimensions!r}")
    return model, texts, encoding, dimensions


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidArgument("'input' must be a string or a non-empty array of strings")
    if all(isinstance(v, int | list) and not isinstance(v, bool) for v in value):
        raise InvalidArgument("'input' as token ids is not supported by this server: the model tokenizes, send text")
    if not all(isinstance(v, str) for v in value):
        raise InvalidArgument("'input' must be a string or a non-empty array of strings")
    if len(value) > MAX_INPUTS:
        raise InvalidArgument(f"'input' holds {len(value)} texts, more than {MAX_INPUTS}")
    if any(not v for v in value):
        raise InvalidArgument("'input' may not contain an empty string")
    return value


async def embed(server: InferenceServer, model: Embedder, texts: list[str],
                 headers: Headers) -> tuple[np.ndarray, int]:
    """The texts' vectors `[len(texts), size]` and their token count, in requests of at most the
    model's batch size, run together."""
    step = model.max_batch or 1
    chunks = [texts[start:start + step] for start in range(0, len(texts), step)]
    answers = await asyncio.gather(*(_infer(server, model, chunk, headers) for chunk in chunks))
    vectors = np.concatenate([vectors for vectors, _ in answers]).astype(np.float32, copy=False)
    return vectors, sum(tokens for _, tokens in answers)


async def _infer(server: InferenceServer, model: Embedder, texts: list[str],
                 headers: Headers) -> tuple[np.ndarray, int]:
    data = np.array([text.encode("utf-8") for text in texts], dtype=object)
    shape = (len(texts), 1) if model.max_batch else (1,)
    outputs = [RequestedOutput(model.vector_output)]
    if model.tokens_output:
        outputs.append(RequestedOutput(model.tokens_output))
    request = InferRequest(model.name, None, [Tensor(model.text_input, DataType.BYTES, shape, data.reshape(shape))],
                           outputs=outputs, parameters=dict(model.parameters))
    carry_trace(server, request, headers)
    response = await _answer(server, request) if model.streamed else await server.infer(request)
    if response.error is not None:
        raise response.error if isinstance(response.error, NaiadError) else InternalError(str(response.error))
    found = {tensor.name: tensor.data for tensor in response.outputs}
    vectors = np.asarray(found[model.vector_output], dtype=np.float32).reshape(len(texts), model.size)
    tokens = int(np.asarray(found[model.tokens_output]).sum()) if model.tokens_output in found else 0
    return vectors, tokens


async def _answer(server: InferenceServer, request: InferRequest) -> InferResponse:
    """A decoupled model's one answer (an "llm" model's embedding: one response, then the final flag)."""
    answer = None
    async for response in server.stream(request):
        if response.error is not None or (answer is None and response.outputs):
            answer = response
    if answer is None:
        raise InternalError(f"model '{request.model_name}' sent no answer")
    return answer


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values
