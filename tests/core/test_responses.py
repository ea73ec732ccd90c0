import numpy as np
import pytest

from naiad.core.responses import ResponseBuilder
from naiad.errors import InternalError, InvalidArgument
from naiad.types import DataType, InferRequest, RequestedOutput, TensorSpec

OUTPUTS = [TensorSpec("SCORES", DataType.FP32, (-1, 4)), TensorSpec("TEXT", DataType.BYTES, (-1, 1))]


def _builder(labels=None) -> ResponseBuilder:
    return ResponseBuilder("m", "3", OUTPUTS, batched=True, labels=labels or {})


def _arrays():
    return {"SCORES": np.array([[0.1, 0.7, 0.2, 0.0]], dtype=np.float32),
            "TEXT": np.array([[b"x"]], dtype=object)}


def test_all_outputs_in_config_order_when_none_requested():
    response = _builder().build(InferRequest("m", None, [], id="r1"), _arrays())
    assert [t.name for t in response.outputs] == ["SCORES", "TEXT"]
    assert response.model_version == "3" and response.id == "r1"


def test_only_requested_outputs():
    request = InferRequest("m", None, [], [RequestedOutput("TEXT")])
    assert [t.name for t in _builder().build(request, _arrays()).outputs] == ["TEXT"]


def test_classification_top_k_with_labels():
    request = InferRequest("m", None, [], [RequestedOutput("SCORES", {"classification": 2})])
    tensor = _builder({"SCORES": ["a", "b"]}).build(request, _arrays()).outputs[0]
    assert tensor.datatype is DataType.BYTES and tensor.shape == (1, 2)
    assert tensor.data.tolist() == [[b"0.700000:1:b", b"0.200000:2"]]


def test_classification_of_bytes_is_refused():
    request = InferRequest("m", None, [], [RequestedOutput("TEXT", {"classification": 1})])
    with pytest.raises(InvalidArgument, match="unsupported type 'BYTES'"):
        _builder().build(request, _arrays())


def test_missing_output_is_an_internal_error():
    with pytest.raises(InternalError, match="output 'TEXT' was not produced"):
        _builder().build(InferRequest("m", None, []), {"SCORES": _arrays()["SCORES"]})
