"""The gRPC inference codec, proven against tritonclient.grpc's own request and result code."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from naiad.errors import InvalidArgument
from naiad.frontends.grpc.codec import decode_infer_request, encode_infer_response
from naiad.types import DataType, InferResponse, Tensor

ALL = list(DataType)
SHAPE = (2, 3)
# Typed contents field for each datatype that has one (FP16 and BF16 travel raw only).
CONTENT_FIELD = {
    DataType.BOOL: "bool_contents", DataType.INT8: "int_contents", DataType.INT16: "int_contents",
    DataType.INT32: "int_contents", DataType.INT64: "int64_contents", DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents", DataType.UINT32: "uint_contents", DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents", DataType.FP64: "fp64_contents", DataType.BYTES: "bytes_contents",
}


def _client_array(datatype: DataType) -> np.ndarray:
    """A [2,3] array as tritonclient wants it (BF16 as ml_dtypes.bfloat16, BYTES as objects)."""
    if datatype is DataType.BYTES:
        return np.array([[b"a", b"", b"\xc3\xa9t\xc3\xa9"], [b"x\x00y", b"0", b"{}"]], dtype=object)
    if datatype is DataType.BOOL:
        return np.array([[True, False, True], [False, False, True]])
    if datatype is DataType.BF16:
        return np.array([[-2, -1.5, 0], [0.25, 1, 3.5]], dtype=ml_dtypes.bfloat16)
    if datatype in (DataType.FP16, DataType.FP32, DataType.FP64):
        return np.array([[-2, -1.5, 0], [0.25, 1, 3.5]], dtype=datatype.numpy)
    info = np.iinfo(datatype.numpy)
    return np.array([[info.min, 0, 1], [2, 100, info.max]], dtype=datatype.numpy)


def _naiad_array(datatype: DataType) -> np.ndarray:
    array = _client_array(datatype)
    return array.view(np.uint16) if datatype is DataType.BF16 else array


def _client_request(inputs: list[Any], outputs: list[Any] | None = None, version: str = "",
                    request_id: str = "", parameters: dict[str, Any] | None = None,
                    priority: int = 0) -> pb.ModelInferRequest:
    return _get_inference_request("m", inputs, version, request_id, outputs, 0, False, False, priority, None,
                                  parameters)


def _client_input(name: str, datatype: DataType, array: np.ndarray) -> grpcclient.InferInput:
    client_input = grpcclient.InferInput(name, list(array.shape), datatype.value)
    return client_input.set_data_from_numpy(array)


def _typed(datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="INPUT0", datatype=datatype, shape=shape,
                       contents=pb.InferTensorContents(**contents))
    return message


def _error(message: pb.ModelInferRequest) -> str:
    with pytest.raises(InvalidArgument) as info:
        decode_infer_request(message)
    return str(info.value)


def _assert_same(datatype: DataType, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if datatype is DataType.BF16:
        assert got.view(np.uint16).tolist() == expected.view(np.uint16).tolist()
    else:
        assert got.tolist() == expected.tolist()


# --------------------------------------------------------------------------- decode: raw contents


@pytest.mark.parametrize("datatype", ALL, ids=lambda d: d.value)
def test_decode_raw_input_from_tritonclient(datatype: DataType) -> None:
    request = decode_infer_request(_client_request([_client_input("INPUT0", datatype, _client_array(datatype))]))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.data.dtype) == ("INPUT0", datatype, SHAPE,
                                                                               datatype.numpy)
    _assert_same(datatype, tensor.data, _naiad_array(datatype))


def test_decode_raw_input_is_a_view_of_the_message_bytes() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tensor,) = decode_infer_request(_client_request([_client_input("INPUT0", DataType.FP32, array)])).inputs
    assert not tensor.data.flags.owndata  # np.frombuffer-style: no copy of the raw bytes


def test_decode_request_fields() -> None:
    inputs = [_client_input("A", DataType.INT32, np.ones((1, 2), np.int32)),
              _client_input("B", DataType.INT32, np.zeros((1, 2), np.int32))]
    outputs = [grpcclient.InferRequestedOutput("OUT1"), grpcclient.InferRequestedOutput("OUT0", class_count=3)]
    message = _client_request(inputs, outputs, version="2", request_id="req-7", priority=3,
                              parameters={"tenant": "blue", "n": -3, "flag": True, "t": 0.5})
    request = decode_infer_request(message)
    assert (request.model_name, request.model_version, request.id) == ("m", 2, "req-7")
    assert [t.name for t in request.inputs] == ["A", "B"]
    assert request.inputs[1].data.tolist() == [[0, 0]]
    assert [(o.name, o.parameters) for o in request.outputs or ()] == [("OUT1", {}), ("OUT0", {"classification": 3})]
    assert request.parameters == {"tenant": "blue", "n": -3, "flag": True, "t": 0.5, "priority": 3}


def test_decode_no_outputs_means_all_and_empty_version_means_policy() -> None:
    request = decode_infer_request(_client_request([_client_input("A", DataType.FP32, np.ones((1, 1), np.float32))]))
    assert request.outputs is None and request.model_version is None and request.id == ""


# ------------------------------------------------------------------------- decode: typed contents


@pytest.mark.parametrize("datatype", list(CONTENT_FIELD), ids=lambda d: d.value)
def test_decode_typed_contents(datatype: DataType) -> None:
    expected = _client_array(datatype)
    values = list(expected.flat) if datatype is DataType.BYTES else expected.ravel().tolist()
    (tensor,) = decode_infer_request(_typed(datatype.value, list(SHAPE), **{CONTENT_FIELD[datatype]: values})).inputs
    assert (tensor.datatype, tensor.shape, tensor.data.dtype) == (datatype, SHAPE, datatype.numpy)
    _assert_same(datatype, tensor.data, expected)


def test_decode_typed_contents_of_an_empty_tensor() -> None:
    (tensor,) = decode_infer_request(_typed("FP32", [1, 0])).inputs
    assert tensor.data.shape == (1, 0) and tensor.data.dtype == np.float32


def test_decode_8_and_16_bit_contents_keep_the_low_bytes_as_triton() -> None:
    (tensor,) = decode_infer_request(_typed("INT8", [2], int_contents=[300, -129])).inputs
    assert tensor.data.tolist() == [44, 127]


EXPLICIT = "unexpected explicit tensor data for input tensor 'INPUT0' for model 'm'"


@pytest.mark.parametrize(("datatype", "contents", "message"), [
    ("FP16", {"fp32_contents": [1.0, 2.0]}, EXPLICIT + " of type 'FP32', expected datatype 'FP16'"),
    ("BF16", {"fp32_contents": [1.0, 2.0]}, EXPLICIT + " of type 'FP32', expected datatype 'BF16'"),
    ("FP32", {"int_contents": [1, 2]}, EXPLICIT + " of type 'INT32', expected datatype 'FP32'"),
    ("INT8", {"uint_contents": [1, 2]}, EXPLICIT + " of type 'UINT32', expected datatype 'INT8'"),
    ("FP32", {"fp32_contents": [1.0, 2.0], "fp64_contents": [1.0, 2.0]},
     EXPLICIT + ", binary data was already supplied."),
    ("FP32", {"fp32_contents": [1.0, 2.0, 3.0]},
     "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 8, got 12"),
    ("FP16", {}, "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 4, got 0"),
    ("BYTES", {"bytes_contents": [b"a"]},
     "expected 2 string elements for inference input 'INPUT0' for model 'm', got 1"),
    ("BYTES", {"bytes_contents": [b"a", b"b", b"c"]},
     "unexpected number of string elements 3 for inference input 'INPUT0' for model 'm', expecting 2"),
])
def test_decode_typed_contents_errors(datatype: str, contents: dict[str, Any], message: str) -> None:
    assert _error(_typed(datatype, [2], **contents)) == message


# -------------------------------------------------------------------------------- decode: errors


def test_decode_raw_and_typed_contents_together_is_refused() -> None:
    message = _typed("FP32", [1], fp32_contents=[1.0])
    message.raw_input_contents.append(np.float32(1).tobytes())
    assert _error(message) == ("contents field must not be specified when using raw_input_contents for 'INPUT0' "
                               "for model 'm'")


def test_decode_missing_and_extra_raw_contents() -> None:
    inputs = [_client_input(n, DataType.FP32, np.ones((1, 1), np.float32)) for n in ("A", "B")]
    message = _client_request(inputs)
    del message.raw_input_contents[1]
    assert _error(message) == "unable to find data for input tensor 'B' for model 'm' in request."
    message = _client_request(inputs)
    message.raw_input_contents.append(b"\x00" * 4)
    assert _error(message) == "unexpected additional input data for model 'm'"


def test_decode_raw_size_mismatch_uses_the_shared_texts() -> None:
    message = _client_request([_client_input("A", DataType.FP32, np.ones((1, 3), np.float32))])
    message.raw_input_contents[0] = b"\x00" * 8
    assert _error(message) == "input byte size mismatch for input 'A' for model 'm'. Expected 12, got 8"
    message.inputs[0].shape[:] = [2**40, 2**40]
    assert _error(message) == ("The shape [1099511627776,1099511627776] of input 'A' for model 'm' causes total "
                               "element count to exceed maximum size of 9223372036854775807")
    message.inputs[0].shape[:] = [1, -3]
    assert _error(message) == "input 'A' for model 'm' has a negative dimension in shape [1,-3]"


def test_decode_duplicates_and_unknown_datatype() -> None:
    data = np.ones((1, 1), np.float32)
    twice = _client_request([_client_input("A", DataType.FP32, data)] * 2)
    assert _error(twice) == "input 'A' already exists in request"
    message = _client_request([_client_input("A", DataType.FP32, data)],
                              [grpcclient.InferRequestedOutput("O"), grpcclient.InferRequestedOutput("O")])
    assert _error(message) == "output 'O' already exists in request"
    message = _client_request([_client_input("A", DataType.FP32, data)])
    message.inputs[0].datatype = "FP8"
    assert _error(message) == "invalid datatype for input A"


@pytest.mark.parametrize(("parameter", "message"), [
    (pb.InferParameter(string_param="3"), "invalid value type for 'classification' parameter, expected int64_param"),
    (pb.InferParameter(int64_param=0), "invalid value for 'classification' parameter, expected >= 0"),
])
def test_decode_classification_errors(parameter: pb.InferParameter, message: str) -> None:
    request = _client_request([_client_input("A", DataType.FP32, np.ones((1, 1), np.float32))],
                              [grpcclient.InferRequestedOutput("O")])
    request.outputs[0].parameters["classification"].CopyFrom(parameter)
    assert _error(request) == message


def test_decode_shared_memory_input_is_left_for_the_frontend() -> None:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="A", datatype="FP32", shape=[1, 2])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    (decoded,) = decode_infer_request(message).inputs
    assert decoded.parameters == {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    assert _error(message) == ("unexpected 'content' provided when using shared memory for input tensor 'A' for "
                               "model 'm'")


# ---------------------------------------------------------------------------------------- encode


def _parse(message: pb.ModelInferResponse) -> grpcclient.InferResult:
    # Through the wire format, as a client sees it.
    return grpcclient.InferResult(pb.ModelInferResponse.FromString(message.SerializeToString()))


@pytest.mark.parametrize("datatype", ALL, ids=lambda d: d.value)
def test_encode_every_datatype_raw_for_tritonclient(datatype: DataType) -> None:
    data = _naiad_array(datatype)
    response = InferResponse("m", "1", "x", [Tensor("OUT", datatype, data.shape, data)])
    result = _parse(encode_infer_response(response))
    output = result.get_output("OUT")
    assert (output.datatype, list(output.shape)) == (datatype.value, list(SHAPE))
    assert not output.HasField("contents")
    _assert_same(datatype, result.as_numpy("OUT"), _client_array(datatype))
    assert result.get_response().id == "x" and result.get_response().model_version == "1"


def test_encode_non_contiguous_and_empty_outputs() -> None:
    data = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    empty = np.empty((2, 0), np.float32)
    response = InferResponse("m", "1", outputs=[Tensor("A", DataType.INT64, data.shape, data),
                                                Tensor("B", DataType.FP32, empty.shape, empty)])
    result = _parse(encode_infer_response(response))
    assert result.as_numpy("A").tolist() == data.tolist()
    assert result.as_numpy("B").shape == (2, 0)
    assert len(result.get_response().raw_output_contents) == 2


def test_encode_parameters_and_shared_memory_outputs() -> None:
    data = np.ones(2, np.float32)
    response = InferResponse("m", "1", outputs=[Tensor("A", DataType.FP32, (2,), data),
                                                Tensor("B", DataType.FP32, (2,), data)],
                             parameters={"n": 3, "flag": True, "s": "x", "f": 0.5, "big": 2**64 - 1})
    message = encode_infer_response(response, {"B"})
    assert list(message.raw_output_contents) == [data.tobytes(), b""]
    assert [o.name for o in message.outputs] == ["A", "B"] and not message.outputs[1].parameters
    assert {k: v.WhichOneof("parameter_choice") for k, v in message.parameters.items()} == {
        "n": "int64_param", "flag": "bool_param", "s": "string_param", "f": "double_param", "big": "uint64_param"}


def test_decode_empty_raw_tensor_with_dims_numpy_cannot_hold() -> None:
    # Found by tests/fuzz/test_grpc_codec.py: numpy refused the shape with a ValueError.
    message = pb.ModelInferRequest(model_name="fuzzed", raw_input_contents=[b""])
    message.inputs.add(name="in0", datatype="UINT16", shape=[0, 4611686018427387904])
    assert _error(message) == (
        "The shape [0,4611686018427387904] of input 'in0' for model 'fuzzed' is too large: its non-zero "
        "dimensions exceed the maximum size of 9223372036854775807 bytes"
    )


def test_decode_empty_typed_contents_with_dims_numpy_cannot_hold() -> None:
    assert _error(_typed("FP32", [0, 2**62])).startswith("The shape [0,4611686018427387904] of input 'INPUT0'")
