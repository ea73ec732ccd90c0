"""The KServe V2 HTTP codec, proven against tritonclient.http's own request/response code."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad.errors import InvalidArgument, Status
from naiad.frontends.http.codec import (
    decode_infer_request,
    decode_raw_request,
    encode_error,
    encode_infer_response,
)
from naiad.frontends.tensors import float_to_bf16_bits
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec

ALL = list(DataType)
SHAPE = (2, 3)


def _client_array(datatype: DataType) -> np.ndarray:
    """A [2,3] array as tritonclient wants it (BF16 as ml_dtypes.bfloat16, BYTES as objects)."""
    if datatype is DataType.BYTES:
        return np.array([[b"a", b"", b"\xc3\xa9t\xc3\xa9"], [b"x y", b"0", b"{}"]], dtype=object)
    if datatype is DataType.BOOL:
        return np.array([[True, False, True], [False, False, True]])
    if datatype is DataType.BF16:
        return np.array([[-2, -1.5, 0], [0.25, 1, 3.5]], dtype=ml_dtypes.bfloat16)
    if datatype in (DataType.FP16, DataType.FP32, DataType.FP64):
        return np.array([[-2, -1.5, 0], [0.25, 1, 3.5]], dtype=datatype.numpy)
    info = np.iinfo(datatype.numpy)
    return np.array([[info.min, 0, 1], [2, 100, info.max]], dtype=datatype.numpy)


def _naiad_array(datatype: DataType) -> np.ndarray:
    """The same values the way naiad holds them (BF16 as raw uint16 bits)."""
    array = _client_array(datatype)
    return array.view(np.uint16) if datatype is DataType.BF16 else array


def _client_body(inputs: list[Any], outputs: list[Any] | None = None, **kwargs: Any) -> tuple[bytes, int | None]:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kwargs)
    return bytes(body), json_size


def _client_input(name: str, datatype: DataType, array: np.ndarray, binary: bool) -> Any:
    client_input = httpclient.InferInput(name, list(array.shape), datatype.value)
    return client_input.set_data_from_numpy(array, binary_data=binary)


def _decode(body: Any, header_length: int | None = None) -> InferRequest:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return decode_infer_request(body, header_length, "m", None)


def _error(body: Any, header_length: int | None = None) -> str:
    with pytest.raises(InvalidArgument) as info:
        _decode(body, header_length)
    return str(info.value)


def _input(datatype: str = "FP32", shape: list[Any] | None = None, **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"name": "INPUT0", "datatype": datatype, "shape": [2] if shape is None else shape}
    item.update(fields)
    if not any(key in item for key in ("data", "parameters")):
        item["data"] = [1.0, 2.0]
    return item


def _response(*tensors: Tensor, **kwargs: Any) -> InferResponse:
    return InferResponse("m", "1", outputs=list(tensors), **kwargs)


def _encode_and_parse(response: InferResponse, request: InferRequest) -> tuple[Any, int | None]:
    body, header_length = encode_infer_response(response, request)
    return httpclient.InferResult.from_response_body(body, header_length=header_length), header_length


def _request(outputs: list[RequestedOutput] | None = None, **parameters: Any) -> InferRequest:
    return InferRequest("m", None, [], outputs=outputs, parameters=parameters)


def _assert_same(datatype: DataType, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if datatype is DataType.BYTES:
        assert [g if isinstance(g, bytes) else g.encode() for g in got.flat] == list(expected.flat)
    else:
        np.testing.assert_array_equal(got, expected)


# ------------------------------------------------------------------------- decode: round trips


@pytest.mark.parametrize("datatype", ALL, ids=lambda d: d.value)
def test_decode_binary_input_from_tritonclient(datatype: DataType) -> None:
    body, json_size = _client_body([_client_input("INPUT0", datatype, _client_array(datatype), True)])
    request = _decode(body, json_size)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", datatype, SHAPE)
    assert tensor.data.dtype == datatype.numpy
    _assert_same(datatype, tensor.data, _naiad_array(datatype))


@pytest.mark.parametrize("datatype", [dt for dt in ALL if dt is not DataType.BF16], ids=lambda d: d.value)
def test_decode_json_input_from_tritonclient(datatype: DataType) -> None:
    body, json_size = _client_body([_client_input("INPUT0", datatype, _client_array(datatype), False)])
    assert json_size is None
    (tensor,) = _decode(body).inputs
    assert (tensor.datatype, tensor.shape, tensor.data.dtype) == (datatype, SHAPE, datatype.numpy)
    _assert_same(datatype, tensor.data, _naiad_array(datatype))


def test_decode_json_bf16_numbers_become_raw_bits() -> None:
    # tritonclient refuses BF16 as JSON; naiad accepts numbers and rounds them to bfloat16.
    (tensor,) = _decode({"inputs": [_input("BF16", [3], data=[1.0, -2.5, 3.14159])]}).inputs
    assert tensor.data.dtype == np.uint16
    expected = np.array([1.0, -2.5, 3.14159], np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(tensor.data, expected)


def test_decode_nested_and_flat_data_agree() -> None:
    nested = _decode({"inputs": [_input("INT32", [2, 2], data=[[1, 2], [3, 4]])]}).inputs[0]
    flat = _decode({"inputs": [_input("INT32", [2, 2], data=[1, 2, 3, 4])]}).inputs[0]
    ragged = _decode({"inputs": [_input("INT32", [2, 2], data=[[1], [2, [3, 4]]])]}).inputs[0]
    for tensor in (nested, flat, ragged):
        np.testing.assert_array_equal(tensor.data, np.array([[1, 2], [3, 4]], np.int32))
    strings = _decode({"inputs": [_input("BYTES", [2, 1], data=[["a"], ["b"]])]}).inputs[0]
    assert strings.data.tolist() == [[b"a"], [b"b"]]


def test_decode_mixed_json_and_binary_inputs_with_everything() -> None:
    inputs = [
        _client_input("A", DataType.FP32, np.arange(4, dtype=np.float32).reshape(1, 4), True),
        _client_input("B", DataType.INT64, np.array([[7, 8]], np.int64), False),
        _client_input("C", DataType.BYTES, np.array([[b"hi"]], dtype=object), True),
    ]
    outputs = [
        httpclient.InferRequestedOutput("X", binary_data=True),
        httpclient.InferRequestedOutput("Y", binary_data=False, class_count=3),
    ]
    body, json_size = _client_body(
        inputs,
        outputs,
        request_id="req-7",
        sequence_id="seq",
        sequence_start=True,
        priority=2,
        timeout=100,
        parameters={"custom": "v", "n": 3, "ratio": 0.5},
    )
    request = _decode(body, json_size)
    assert (request.model_name, request.model_version, request.id) == ("m", None, "req-7")
    assert request.parameters == {
        "sequence_id": "seq",
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 100,
        "custom": "v",
        "n": 3,
        "ratio": 0.5,
    }
    assert [t.name for t in request.inputs] == ["A", "B", "C"]
    np.testing.assert_array_equal(request.inputs[0].data, np.arange(4, dtype=np.float32).reshape(1, 4))
    assert request.inputs[0].parameters == {"binary_data_size": 16}
    assert request.inputs[1].data.tolist() == [[7, 8]]
    assert request.inputs[2].data.tolist() == [[b"hi"]]
    assert request.outputs == [
        RequestedOutput("X", {"binary_data": True}),
        RequestedOutput("Y", {"binary_data": False, "classification": 3}),
    ]


def test_decode_defaults_and_binary_data_output_kept() -> None:
    body, json_size = _client_body([_client_input("INPUT0", DataType.FP32, np.ones((1, 2), np.float32), True)])
    request = decode_infer_request(body, json_size, "m", 3)
    assert request.model_version == 3 and request.id == "" and request.outputs is None
    assert request.parameters == {"binary_data_output": True}


def test_decode_accepts_bytearray_and_memoryview_bodies() -> None:
    body, json_size = _client_body([_client_input("INPUT0", DataType.INT8, np.ones((1, 2), np.int8), True)])
    for wrapped in (bytearray(body), memoryview(body)):
        assert decode_infer_request(wrapped, json_size, "m", None).inputs[0].data.tolist() == [[1, 1]]


def test_decode_binary_input_is_a_view_of_the_body() -> None:
    body, json_size = _client_body([_client_input("INPUT0", DataType.FP32, np.zeros((1, 2), np.float32), True)])
    buffer = bytearray(body)
    tensor = decode_infer_request(buffer, json_size, "m", None).inputs[0]
    buffer[-4:] = np.float32(5).tobytes()
    assert tensor.data[0, 1] == 5


def test_decode_empty_outputs_list_means_all_outputs() -> None:
    assert _decode({"inputs": [_input()], "outputs": []}).outputs is None


def test_decode_zero_element_inputs() -> None:
    request = _decode({"inputs": [_input("FP32", [0, 3], data=[]), _input("BYTES", [0], name="B", data=[])]})
    assert [t.data.shape for t in request.inputs] == [(0, 3), (0,)]
    body, json_size = _client_body([_client_input("E", DataType.INT32, np.zeros((2, 0), np.int32), True)])
    assert _decode(body, json_size).inputs[0].data.shape == (2, 0)


def test_decode_accepts_nan_and_infinity_literals() -> None:
    body = b'{"inputs":[{"name":"I","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]}]}'
    data = _decode(body).inputs[0].data
    assert np.isnan(data[0]) and data[1] == np.inf and data[2] == -np.inf


def test_decode_integers_in_float_inputs_and_large_integers() -> None:
    data = _decode({"inputs": [_input("FP64", [3], data=[1, 2.5, -3])]}).inputs[0].data
    assert data.dtype == np.float64 and data.tolist() == [1.0, 2.5, -3.0]
    data = _decode({"inputs": [_input("UINT64", [3], data=[0, 2**64 - 1, 2**63 + 1])]}).inputs[0].data
    assert data.dtype == np.uint64 and data.tolist() == [0, 2**64 - 1, 2**63 + 1]
    data = _decode({"inputs": [_input("INT64", [2], data=[-(2**63), 2**63 - 1])]}).inputs[0].data
    assert data.dtype == np.int64 and data.tolist() == [-(2**63), 2**63 - 1]


# ------------------------------------------------------------------------- decode: errors


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ([], "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ({"inputs": {}}, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
        ({"id": 5, "inputs": []}, "Unable to parse 'id': attempt to access JSON non-string as string"),
        (
            {"inputs": [{"name": "I", "datatype": "FP32", "shape": [1]}]},
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
        ),
        (
            {"inputs": [_input(data=[1.0], parameters={"binary_data_size": 4})]},
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
        ),
        (
            {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]},
            "Unable to parse 'name': attempt to access non-existing object member 'name'",
        ),
        (
            {"inputs": [{"name": 1, "datatype": "FP32", "shape": [1], "data": [1]}]},
            "Unable to parse 'name': attempt to access JSON non-string as string",
        ),
        (
            {"inputs": [{"name": "I", "shape": [1], "data": [1]}]},
            "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'",
        ),
        (
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1]}]},
            "Unable to parse 'shape': attempt to access non-existing object member 'shape' for input 'INPUT0'",
        ),
        (
            {"inputs": [_input(shape=2)]},
            "Unable to parse 'shape': attempt to access JSON non-array as array for input 'INPUT0'",
        ),
        (
            {"inputs": [_input(shape=[2, -5])]},
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer "
            "for input 'INPUT0'",
        ),
        (
            {"inputs": [_input(shape=[2.0])]},
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer "
            "for input 'INPUT0'",
        ),
        ({"inputs": [_input("FLOAT")]}, "invalid datatype for input INPUT0"),
        (
            {"inputs": [_input(), _input()]},
            "input 'INPUT0' already exists in request",
        ),
        (
            {"inputs": [_input("FP32", [2**4, 2**60 + 2], data=[1.0])]},
            "The shape [16,1152921504606846978] of input 'INPUT0' for model 'm' causes total element "
            "count to exceed maximum size of 9223372036854775807",
        ),
        (
            {"inputs": [_input("FP32", [2**2, 2**60 + 2], data=[1.0])]},
            "byte size overflow for input 'INPUT0' for model 'm'",
        ),
    ],
)
def test_decode_structure_errors(body: Any, message: str) -> None:
    assert _error(body) == message


MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field for input 'INPUT0'"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (_input("FP32", [3], data=[1.0, 2.0]), f"{MISMATCH} (shape [3] has 3 elements, 'data' has 2)"),
        (_input("FP32", [1], data=[1.0, 2.0]), f"{MISMATCH} (shape [1] has 1 elements, 'data' has 2)"),
        (_input("BYTES", [2], data=["a"]), f"{MISMATCH} (shape [2] has 2 elements, 'data' has 1)"),
        (
            _input("INT32", [2, 2], data=[[1, 2], [3]]),
            f"{MISMATCH} (shape [2,2] has 4 elements, 'data' has 3)",
        ),
        (
            _input("INT32", [2], data=[1, 2.5]),
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer for input 'INPUT0'",
        ),
        (
            _input("INT32", [2], data=[True, False]),
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer for input 'INPUT0'",
        ),
        (
            _input("UINT8", [2], data=[1, -1]),
            "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer "
            "for input 'INPUT0'",
        ),
        (
            _input("INT8", [2], data=[1, 300]),
            "Unable to parse 'data': value 300 is out of range for INT8 for input 'INPUT0'",
        ),
        (
            _input("INT16", [2], data=[-40000, 1]),
            "Unable to parse 'data': value -40000 is out of range for INT16 for input 'INPUT0'",
        ),
        (
            _input("UINT32", [1], data=[2**32]),
            "Unable to parse 'data': value 4294967296 is out of range for UINT32 for input 'INPUT0'",
        ),
        (
            _input("INT64", [1], data=[2**63]),
            "Unable to parse 'data': value 9223372036854775808 is out of range for INT64 for input 'INPUT0'",
        ),
        (
            _input("BOOL", [2], data=[1, 0]),
            "Unable to parse 'data': attempt to access JSON non-boolean as boolean for input 'INPUT0'",
        ),
        (
            _input("FP32", [2], data=["1.5", 2]),
            "Unable to parse 'data': attempt to access JSON non-number as double for input 'INPUT0'",
        ),
        (
            _input("FP16", [2], data=[None, 2]),
            "Unable to parse 'data': attempt to access JSON non-number as double for input 'INPUT0'",
        ),
        (
            _input("BYTES", [2], data=["a", 1]),
            "Unable to parse 'data': attempt to access JSON non-string as string for input 'INPUT0'",
        ),
        (
            _input("FP32", [1], data=1.0),
            "Unable to parse 'data': attempt to access JSON non-array as array for input 'INPUT0'",
        ),
    ],
)
def test_decode_data_errors(item: dict[str, Any], message: str) -> None:
    assert _error({"inputs": [item]}) == message


def test_decode_malformed_json() -> None:
    assert _error(b'{"inputs": [') == "failed to parse the request JSON buffer: Input data was truncated"
    assert _error(b"{x") == (
        "failed to parse the request JSON buffer: JSON is malformed: object keys must be strings (byte 1)"
    )
    assert (
        _error(b"[1] x") == "failed to parse the request JSON buffer: JSON is malformed: trailing characters (byte 5)"
    )
    assert _error(b"") == "failed to parse the request JSON buffer: Input data was truncated"


def test_decode_too_deep_json() -> None:
    body = b'{"inputs": [{"data": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"
    assert _error(body) == ("failed to parse the request JSON buffer: JSON nesting depth exceeds maximum allowed limit")


@pytest.mark.parametrize("header_length", [-1, 10_000])
def test_decode_header_length_out_of_range(header_length: int) -> None:
    body = json.dumps({"inputs": [_input()]}).encode()
    assert _error(body, header_length) == (
        f"inference header size should be in range (0, {len(body)}), got: {header_length}"
    )


def _binary_body(*sizes: int, extra: bytes = b"", missing: int = 0) -> tuple[bytes, int]:
    items = [
        _input("UINT8", [size], name=f"IN{i}", parameters={"binary_data_size": size}) for i, size in enumerate(sizes)
    ]
    header = json.dumps({"inputs": items}).encode()
    return header + b"\x01" * (sum(sizes) - missing) + extra, len(header)


def test_decode_binary_section_too_short() -> None:
    body, header_length = _binary_body(4, 8, missing=3)
    assert _error(body, header_length) == "unexpected size for input 'IN1', expecting 3 additional bytes for model 'm'"


def test_decode_binary_section_too_long() -> None:
    body, header_length = _binary_body(4, 8, extra=b"zz")
    assert _error(body, header_length) == "unexpected additional input data for model 'm'"


def test_decode_binary_without_header_length() -> None:
    body, header_length = _binary_body(4)
    assert _error(body[:header_length], None) == (
        "must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' "
        "when passing inputs in binary data format"
    )


def test_decode_binary_size_not_matching_shape() -> None:
    header = json.dumps({"inputs": [_input("FP32", [8], parameters={"binary_data_size": 40})]}).encode()
    assert _error(header + b"\x00" * 40, len(header)) == (
        "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 32, got 40"
    )


def test_decode_binary_bytes_count_mismatch() -> None:
    raw = b"".join(len(s).to_bytes(4, "little") + s for s in [b"x"] * 14)
    header = json.dumps({"inputs": [_input("BYTES", [16], name="INPUT1", parameters={"binary_data_size": len(raw)})]})
    assert _error(header.encode() + raw, len(header)) == (
        "expected 16 string elements for inference input 'INPUT1' for model 'm', got 14"
    )


def test_decode_bad_binary_data_size() -> None:
    item = _input(parameters={"binary_data_size": -4})
    assert _error({"inputs": [item]}) == (
        "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as unsigned-integer "
        "for input 'INPUT0'"
    )


def test_decode_shared_memory_input_is_a_placeholder_for_resolve_inputs() -> None:
    client_input = httpclient.InferInput("INPUT0", [2, 3], "INT32").set_shared_memory("r", 24, offset=8)
    output = httpclient.InferRequestedOutput("OUT")
    output.set_shared_memory("o", 64)
    request = _decode(_client_body([client_input], [output])[0])
    (tensor,) = request.inputs
    assert (tensor.datatype, tensor.shape, tensor.data.size) == (DataType.INT32, (2, 3), 0)
    assert tensor.parameters == {"shared_memory_region": "r", "shared_memory_byte_size": 24,
                                 "shared_memory_offset": 8}
    assert request.outputs == [RequestedOutput("OUT", {"binary_data": False, "shared_memory_region": "o",
                                                       "shared_memory_byte_size": 64})]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_region": 5}, "Unable to parse 'shared_memory_region': attempt to access JSON non-string as "
                                      "string"),
        ({"shared_memory_region": "r", "shared_memory_offset": -1},
         "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": "8"},
         "Unable to parse 'shared_memory_byte_size': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ],
)
def test_decode_shared_memory_parameter_types_answer_500_like_triton(parameters: dict, message: str) -> None:
    for body in ({"inputs": [_input(parameters=parameters)]},
                 {"inputs": [_input()], "outputs": [{"name": "OUT", "parameters": parameters}]}):
        with pytest.raises(InvalidArgument) as info:
            _decode(body)
        assert (info.value.message, info.value.status) == (message, Status.INTERNAL)


def test_decode_shared_memory_input_must_not_carry_data() -> None:
    item = _input(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8}, data=[1.0, 2.0])
    assert _error({"inputs": [item]}) == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"classification": 2}, "Output can't set both 'shared_memory_region' and 'classification'"),
        ({"binary_data": True}, "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ],
)
def test_decode_shared_memory_output_conflicts(extra: dict, message: str) -> None:
    output = {"name": "OUT", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8, **extra}}
    assert _error({"inputs": [_input()], "outputs": [output]}) == message


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"triton_enable_empty_final_response": True},
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
        ),
        ([], "failed to get request params.: attempt to get members for non-object"),
        ({"x": None}, "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ({"x": [1]}, "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
        (
            {"priority": -1},
            "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"timeout": 1.5},
            "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"sequence_start": 1},
            "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"binary_data_output": "yes"},
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean",
        ),
        ({"sequence_id": -3}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ],
)
def test_decode_request_parameter_errors(parameters: Any, message: str) -> None:
    assert _error({"parameters": parameters, "inputs": [_input()]}) == message


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({}, "Unable to parse 'outputs': attempt to access JSON non-array as array"),
        ([{"parameters": {}}], "Unable to parse 'name': attempt to access non-existing object member 'name'"),
        ([{"name": "O"}, {"name": "O"}], "output 'O' already exists in request"),
        (
            [{"name": "O", "parameters": {"binary_data": 1}}],
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
        (
            [{"name": "O", "parameters": {"classification": -1}}],
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
    ],
)
def test_decode_output_errors(outputs: Any, message: str) -> None:
    assert _error({"inputs": [_input()], "outputs": outputs}) == message


# ------------------------------------------------------------------------- raw binary requests


def test_raw_request_deduces_the_variable_dim() -> None:
    spec = TensorSpec("INPUT0", DataType.FP32, (-1, 4))
    body = np.arange(8, dtype=np.float32).tobytes()
    request = decode_raw_request(body, spec, 1, "m", None, batching=False)
    (tensor,) = request.inputs
    assert tensor.shape == (2, 4) and tensor.data.shape == (2, 4)
    np.testing.assert_array_equal(tensor.data.ravel(), np.arange(8, dtype=np.float32))
    assert request.parameters == {"binary_data_output": True} and request.outputs is None


def test_raw_request_batching_model_is_batch_one() -> None:
    spec = TensorSpec("INPUT0", DataType.INT32, (-1, -1))
    request = decode_raw_request(np.arange(5, dtype=np.int32).tobytes(), spec, 1, "m", 2, batching=True)
    assert request.inputs[0].shape == (1, 5) and request.model_version == 2
    fixed = TensorSpec("INPUT0", DataType.FP32, (-1, 4))
    with pytest.raises(InvalidArgument) as info:
        decode_raw_request(b"\x00" * 32, fixed, 1, "m", None, batching=True)
    assert str(info.value) == "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 32"


def test_raw_request_guesses_batching_when_not_told() -> None:
    spec = TensorSpec("INPUT0", DataType.FP32, (-1, -1))
    assert decode_raw_request(b"\x00" * 12, spec, 1, "m", None).inputs[0].shape == (1, 3)
    spec = TensorSpec("INPUT0", DataType.FP32, (-1,))
    assert decode_raw_request(b"\x00" * 12, spec, 1, "m", None).inputs[0].shape == (3,)


def test_raw_request_bytes_is_one_unprefixed_element() -> None:
    request = decode_raw_request(b"hello", TensorSpec("TEXT", DataType.BYTES, (1,)), 1, "m", None, batching=False)
    assert request.inputs[0].shape == (1,) and request.inputs[0].data.tolist() == [b"hello"]
    batched = TensorSpec("TEXT", DataType.BYTES, (-1, 1))
    request = decode_raw_request(b"", batched, 1, "m", None, batching=True)
    assert request.inputs[0].shape == (1, 1) and request.inputs[0].data.tolist() == [[b""]]


@pytest.mark.parametrize(
    ("spec", "count", "message"),
    [
        (
            TensorSpec("INPUT0", DataType.FP32, (8,)),
            3,
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'm' model configuration",
        ),
        (
            TensorSpec("INPUT0", DataType.BYTES, (2,)),
            1,
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        (
            TensorSpec("INPUT0", DataType.BYTES, (-1,)),
            1,
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        (
            TensorSpec("INPUT0", DataType.FP32, (-1, -1)),
            1,
            "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
            "variable-sized dimension",
        ),
        (
            TensorSpec("INPUT0", DataType.FP32, (8,)),
            1,
            "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 32, got 40",
        ),
        (
            TensorSpec("INPUT0", DataType.FP32, (-1,)),
            1,
            "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 40, got 42",
        ),
    ],
)
def test_raw_request_errors(spec: TensorSpec, count: int, message: str) -> None:
    body = b"\x00" * (42 if spec.shape == (-1,) else 40)
    with pytest.raises(InvalidArgument) as info:
        decode_raw_request(body, spec, count, "m", None, batching=False)
    assert str(info.value) == message


# ------------------------------------------------------------------------- encode


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL, ids=lambda d: d.value)
def test_encode_round_trip_through_tritonclient(datatype: DataType, binary: bool) -> None:
    tensor = Tensor("OUT", datatype, SHAPE, _naiad_array(datatype))
    request = _request([RequestedOutput("OUT", {"binary_data": binary})])
    result, header_length = _encode_and_parse(_response(tensor), request)
    assert (header_length is not None) is binary
    output = result.get_output("OUT")
    assert (output["datatype"], output["shape"]) == (datatype.value, list(SHAPE))
    if binary:
        assert output["parameters"]["binary_data_size"] == len(bytes(_wire(datatype)))
    _assert_same(datatype, result.as_numpy("OUT"), _client_array(datatype))


def _wire(datatype: DataType) -> bytes:
    array = _naiad_array(datatype)
    if datatype is DataType.BYTES:
        return b"".join(len(b).to_bytes(4, "little") + b for b in array.flat)
    return array.tobytes()


def test_encode_identity_request_end_to_end() -> None:
    array = np.arange(16, dtype=np.float32).reshape(1, 16)
    for binary in (True, False):
        body, json_size = _client_body(
            [_client_input("INPUT0", DataType.FP32, array, binary)],
            [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)],
            request_id="42",
        )
        request = _decode(body, json_size)
        echo = Tensor("OUTPUT0", DataType.FP32, request.inputs[0].shape, request.inputs[0].data)
        result, _ = _encode_and_parse(_response(echo, id=request.id), request)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
        assert result.get_response()["id"] == "42"


def test_encode_json_document_layout() -> None:
    tensor = Tensor("OUT", DataType.INT32, (2,), np.array([1, 2], np.int32), {"note": "x"})
    body, header_length = encode_infer_response(_response(tensor), _request())
    assert header_length is None
    assert body == (
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"OUT","datatype":"INT32",'
        b'"shape":[2],"parameters":{"note":"x"},"data":[1,2]}]}'
    )
    response = _response(tensor, id="abc", parameters={"sequence_id": 1})
    document = json.loads(encode_infer_response(response, _request())[0])
    assert document["id"] == "abc" and document["parameters"] == {"sequence_id": 1}


def test_encode_binary_layout() -> None:
    a = Tensor("A", DataType.FP32, (2,), np.array([1, 2], np.float32))
    b = Tensor("B", DataType.UINT8, (3,), np.array([7, 8, 9], np.uint8))
    body, header_length = encode_infer_response(_response(a, b), _request(binary_data_output=True))
    header = json.loads(body[:header_length])
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": 8}, {"binary_data_size": 3}]
    assert "data" not in header["outputs"][0]
    assert body[header_length:] == np.array([1, 2], np.float32).tobytes() + b"\x07\x08\x09"


def test_binary_data_output_applies_only_when_no_outputs_are_listed() -> None:
    a = Tensor("A", DataType.FP32, (1,), np.array([1], np.float32))
    b = Tensor("B", DataType.FP32, (1,), np.array([2], np.float32))
    _, header_length = encode_infer_response(_response(a, b), _request(binary_data_output=True))
    assert header_length is not None
    listed = _request([RequestedOutput("A"), RequestedOutput("B")], binary_data_output=True)
    assert encode_infer_response(_response(a, b), listed)[1] is None
    per_output = _request([RequestedOutput("A", {"binary_data": True}), RequestedOutput("B")])
    body, header_length = encode_infer_response(_response(a, b), per_output)
    outputs = json.loads(body[:header_length])["outputs"]
    assert "data" not in outputs[0] and outputs[1]["data"] == [2.0]
    assert encode_infer_response(_response(a, b), _request(binary_data_output=False))[1] is None


def test_encode_raw_request_answers_binary() -> None:
    spec = TensorSpec("INPUT0", DataType.FP32, (2,))
    request = decode_raw_request(np.ones(2, np.float32).tobytes(), spec, 1, "m", None, batching=False)
    echo = Tensor("OUTPUT0", DataType.FP32, (2,), request.inputs[0].data)
    result, header_length = _encode_and_parse(_response(echo), request)
    assert header_length is not None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones(2, np.float32))


def test_encode_non_finite_floats_as_json_literals() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    tensors = [
        Tensor("F", DataType.FP32, (4,), values),
        Tensor("H", DataType.FP16, (4,), values.astype(np.float16)),
    ]
    body, _ = encode_infer_response(_response(*tensors), _request())
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in body
    result = httpclient.InferResult.from_response_body(body)
    for name in ("F", "H"):
        got = result.as_numpy(name)
        assert np.isnan(got[0]) and got[1:].tolist() == [np.inf, -np.inf, 1.5]


def test_encode_null_parameter_does_not_disturb_data() -> None:
    tensor = Tensor("F", DataType.FP32, (1,), np.array([0.5], np.float32))
    body, _ = encode_infer_response(_response(tensor, parameters={"x": None}), _request())
    assert json.loads(body)["outputs"][0]["data"] == [0.5]


def test_encode_non_utf8_bytes_fall_back_to_binary() -> None:
    tensor = Tensor("B", DataType.BYTES, (2,), np.array([b"ok", b"\xff\xfe"], dtype=object))
    result, header_length = _encode_and_parse(_response(tensor), _request([RequestedOutput("B")]))
    assert header_length is not None
    assert result.as_numpy("B").tolist() == [b"ok", b"\xff\xfe"]


def test_encode_accepts_numpy_scalars_and_str_elements() -> None:
    shape = tuple(np.int64(d) for d in (2,))
    tensor = Tensor("B", DataType.BYTES, shape, np.array(["a", b"b"], dtype=object), {"n": np.int32(3)})
    document = json.loads(encode_infer_response(_response(tensor), _request())[0])
    assert document["outputs"][0] == {
        "name": "B",
        "datatype": "BYTES",
        "shape": [2],
        "parameters": {"n": 3},
        "data": ["a", "b"],
    }


def test_encode_bf16_json_from_bits() -> None:
    bits = float_to_bf16_bits(np.array([1.0, -2.5], np.float32))
    document = json.loads(encode_infer_response(_response(Tensor("X", DataType.BF16, (2,), bits)), _request())[0])
    assert document["outputs"][0]["data"] == [1.0, -2.5]


def test_encode_error() -> None:
    assert encode_error('bad "thing"') == b'{"error":"bad \\"thing\\""}'


def test_decode_header_length_equal_to_body_is_all_json() -> None:
    body = json.dumps({"inputs": [_input()]}).encode()
    assert _decode(body, len(body)).inputs[0].data.tolist() == [1.0, 2.0]


def test_encode_outputs_in_shared_memory_carry_no_data_and_no_parameters() -> None:
    written = Tensor("OUT0", DataType.FP32, (1, 4), np.arange(4, dtype=np.float32))
    binary = Tensor("OUT1", DataType.INT32, (2,), np.array([7, 8], dtype=np.int32))
    plain = Tensor("OUT2", DataType.INT32, (1,), np.array([9], dtype=np.int32))
    request = InferRequest("m", None, [], [
        RequestedOutput("OUT0", {"binary_data": False, "shared_memory_region": "r", "shared_memory_byte_size": 16}),
        RequestedOutput("OUT1", {"binary_data": True}),
        RequestedOutput("OUT2"),
    ])
    body, json_length = encode_infer_response(_response(written, binary, plain), request, {"OUT0"})
    assert json_length is not None
    assert json.loads(body[:json_length])["outputs"] == [
        {"name": "OUT0", "datatype": "FP32", "shape": [1, 4]},
        {"name": "OUT1", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "OUT2", "datatype": "INT32", "shape": [1], "data": [9]},
    ]
    assert body[json_length:] == np.array([7, 8], dtype=np.int32).tobytes()


def test_encode_only_shared_memory_outputs_is_plain_json() -> None:
    written = Tensor("OUT0", DataType.BYTES, (1,), np.array([b"\xff"], dtype=object))
    request = InferRequest("m", None, [], [RequestedOutput("OUT0", {"shared_memory_region": "r"})])
    body, json_length = encode_infer_response(_response(written), request, {"OUT0"})
    assert json_length is None
    assert json.loads(body)["outputs"] == [{"name": "OUT0", "datatype": "BYTES", "shape": [1]}]


def test_decode_empty_tensor_with_a_dim_numpy_cannot_hold() -> None:
    # Found by tests/fuzz/test_http_codec.py: a zero dim made the element count 0, so the
    # overflow check passed, and numpy then refused the shape with a ValueError (a 500).
    body = b'{"inputs": [{"name": "", "datatype": "BOOL", "shape": [0, 9223372036854775808], "data": []}]}'
    assert _error(body, len(body)) == (
        "The shape [0,9223372036854775808] of input '' for model 'm' is too large: its non-zero "
        "dimensions exceed the maximum size of 9223372036854775807 bytes"
    )


def test_decode_empty_binary_tensor_with_dims_past_int64_bytes() -> None:
    header = json.dumps({"inputs": [_input("FP64", [2**60, 0], parameters={"binary_data_size": 0})]}).encode()
    message = _error(header, len(header))
    assert message.startswith("The shape [1152921504606846976,0] of input 'INPUT0' for model 'm' is too large")
