"""Which models serve /v1/embeddings (naiad.frontends.http.openai_tasks) and how the endpoint
reads a request, without a server."""

from __future__ import annotations

from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import parse_config_text
from naiad.errors import InternalError, InvalidArgument, NotFound
from naiad.frontends.http.openai_embeddings import _parse
from naiad.frontends.http.openai_tasks import embedder

TEXT_TO_VECTOR = """
max_batch_size: 32
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] } ]
"""


def _config(text: str) -> mc.ModelConfig:
    return parse_config_text(text, "test")


def test_a_text_to_vector_model_is_an_embedder_without_saying_so() -> None:
    found = embedder("m", _config(TEXT_TO_VECTOR))
    assert found is not None
    assert (found.text_input, found.vector_output, found.size, found.max_batch, found.tokens_output) == (
        "TEXT", "EMBEDDING", 384, 32, None)


@pytest.mark.parametrize("text", [
    'backend: "llm" input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ] '
    'output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]',  # generates text
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ] '
    'output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    'input [ { name: "T" data_type: TYPE_STRING dims: [ 1 ] }, { name: "U" data_type: TYPE_STRING dims: [ 1 ] } ] '
    'output [ { name: "V" data_type: TYPE_FP32 dims: [ 8 ] } ]',  # two texts in: not clear
    TEXT_TO_VECTOR + 'parameters { key: "openai_task" value: { string_value: "rerank" } }',
])
def test_other_models_are_not(text: str) -> None:
    assert embedder("m", _config(text)) is None


def test_a_declared_embedder_names_its_token_output_and_a_wrong_shape_is_a_config_error() -> None:
    declared = embedder("m", _config(
        TEXT_TO_VECTOR.replace('dims: [ 384 ] }', 'dims: [ 384 ] }, { name: "N" data_type: TYPE_INT64 dims: [ 1 ] }')
        + 'parameters { key: "openai_task" value: { string_value: "embedding" } }'
        + 'parameters { key: "openai_tokens_output" value: { string_value: "N" } }'))
    assert declared is not None and declared.tokens_output == "N"
    with pytest.raises(InternalError, match="declares openai_task embedding"):
        embedder("m", _config('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                              'output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                              'parameters { key: "openai_task" value: { string_value: "embedding" } }'))


class _Server:
    def model_config_message(self, name: str, version: int | None) -> mc.ModelConfig:
        if name == "nope":
            raise NotFound("Request for unknown model: 'nope' is not found")
        if name == "adder":
            return _config('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                           'output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]')
        return _config(TEXT_TO_VECTOR)


def _read(**body: Any) -> Any:
    return _parse(_Server(), {"model": "m", "input": "hello", **body})  # type: ignore[arg-type]


def test_a_request_is_read() -> None:
    model, texts, encoding, dimensions = _read(input=["a", "b"], encoding_format="base64", dimensions=64, user="u")
    assert (model.name, texts, encoding, dimensions) == ("m", ["a", "b"], "base64", 64)
    assert _read()[1:] == (["hello"], "float", None)


@pytest.mark.parametrize(("body", "error", "message"), [
    ({"model": "nope"}, NotFound, "The model 'nope' does not exist"),
    ({"model": "adder"}, InvalidArgument, "does not serve embeddings"),
    ({"input": [1, 2, 3]}, InvalidArgument, "token ids is not supported"),
    ({"input": [[1, 2], [3]]}, InvalidArgument, "token ids is not supported"),
    ({"input": []}, InvalidArgument, "non-empty array of strings"),
    ({"input": ["a", ""]}, InvalidArgument, "empty string"),
    ({"input": ["a"] * 2049}, InvalidArgument, "more than 2048"),
    ({"encoding_format": "int8"}, InvalidArgument, "'encoding_format'"),
    ({"dimensions": 0}, InvalidArgument, "from 1 to 384"),
    ({"dimensions": 385}, InvalidArgument, "from 1 to 384"),
    ({"dimensions": True}, InvalidArgument, "'dimensions'"),
    ({"frobnicate": 1}, InvalidArgument, "unknown field 'frobnicate'"),
])
def test_bad_requests_are_refused(body: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        _read(**body)
    assert message in str(caught.value)
