"""Every datatype through identity models over gRPC: raw contents with tritonclient.grpc, typed
contents with the raw stub, empty tensors, BYTES and BF16 edge values (SPEC §1.2, §3)."""

from __future__ import annotations

from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.infer_models import DATATYPES, identity_name, sample
from e2e.infer_models import infer_server as infer_server  # the fixture

pytestmark = pytest.mark.e2e

ALL = list(DATATYPES)
# The typed-contents field of each datatype that has one; FP16 and BF16 must travel raw.
CONTENT_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


@pytest.fixture
def client(infer_server: Any) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(infer_server.grpc_url)


@pytest.fixture
def stub(infer_server: Any) -> Any:
    with grpc.insecure_channel(infer_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _infer(client: grpcclient.InferenceServerClient, datatype: str, data: np.ndarray,
           batched: bool = True) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return client.infer(identity_name(datatype, batched), [tensor])


def _assert_same(datatype: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if datatype == "BF16":
        assert got.dtype == ml_dtypes.bfloat16
        assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist()
    elif datatype == "BYTES":
        assert list(got.flat) == list(want.flat)
    else:
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


@pytest.mark.parametrize("datatype", ALL)
def test_round_trip_raw_contents(client: Any, datatype: str) -> None:
    for batched, shape in ((True, (3, 5)), (False, (7,))):
        data = sample(datatype, shape)
        result = _infer(client, datatype, data, batched)
        output = result.get_output("OUTPUT0")
        assert (output.datatype, list(output.shape)) == (datatype, list(shape))
        assert not output.parameters  # no binary_data_size or anything else on gRPC
        assert len(result.get_response().raw_output_contents) == 1
        _assert_same(datatype, result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", list(CONTENT_FIELD))
def test_typed_contents_come_back_raw(stub: Any, datatype: str) -> None:
    data = sample(datatype, (2, 3))
    values = list(data.flat) if datatype == "BYTES" else data.ravel().tolist()
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype), id="typed")
    request.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3],
                       contents=service_pb2.InferTensorContents(**{CONTENT_FIELD[datatype]: values}))
    result = grpcclient.InferResult(stub.ModelInfer(request, timeout=10))
    assert result.get_response().id == "typed"
    assert not result.get_output("OUTPUT0").HasField("contents")  # answers are always raw
    _assert_same(datatype, result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_floats_cannot_be_typed_contents(stub: Any, datatype: str) -> None:
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype))
    request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 2],
                       contents=service_pb2.InferTensorContents(fp32_contents=[1.0, 2.0]))
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"unexpected explicit tensor data for input tensor 'INPUT0' for model '{identity_name(datatype)}' of type "
        f"'FP32', expected datatype '{datatype}'")


@pytest.mark.parametrize("datatype", ALL)
def test_empty_tensors(client: Any, datatype: str) -> None:
    for batched, shape in ((True, (1, 0)), (True, (3, 0)), (False, (0,))):
        got = _infer(client, datatype, sample(datatype, shape), batched).as_numpy("OUTPUT0")
        assert got.shape == shape and got.size == 0


def test_bytes_keep_nul_and_utf8_and_str_goes_out_as_utf8(client: Any) -> None:
    words = [b"", b"\x00", b"a\x00b\x00", "na\u00efve \u2603 \U0001f600".encode(), b"\xff\xfe"[:0]]
    data = np.array([words], dtype=np.object_)
    _assert_same("BYTES", _infer(client, "BYTES", data).as_numpy("OUTPUT0"), data)
    text = np.array([["\u00e9", "\u4e2d\u6587", "x"]], dtype=np.object_)
    assert _infer(client, "BYTES", text).as_numpy("OUTPUT0").tolist() == [[s.encode() for s in text[0]]]


def test_bytes_that_are_not_utf8_are_refused_by_onnxruntime(client: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "BYTES", np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_))
    assert (caught.value.status(), caught.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "input 'INPUT0' holds BYTES that are not valid UTF-8, which the onnxruntime backend cannot pass to a string "
        "tensor")


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
def test_non_finite_floats(client: Any, datatype: str) -> None:
    dtype = ml_dtypes.bfloat16 if datatype == "BF16" else np.dtype(datatype.replace("FP", "float"))
    data = np.array([[np.nan, np.inf, -np.inf, -0.0, 1.5]], dtype=dtype)
    got = _infer(client, datatype, data).as_numpy("OUTPUT0").astype(np.float64)
    assert np.isnan(got[0, 0]) and got[0, 1:].tolist() == [np.inf, -np.inf, 0.0, 1.5]
    assert np.signbit(got[0, 3])
