"""Fuzz the gRPC request decoder: ModelInferRequest messages built from random tensors (raw or
typed contents), then given wrong shapes, datatypes, parameters and versions, and serialized
messages with mutated bytes. Every message decodes to tensors that agree with their declared
shape and datatype, or fails with a NaiadError that has a message."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from google.protobuf.message import DecodeError
from hypothesis import given, note
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from fuzz.strategies import DATATYPES, check_array, check_error, fuzz_settings, mutated, odd_shapes, tensors, wire
from naiad.errors import NaiadError
from naiad.frontends.grpc.codec import decode_infer_request
from naiad.frontends.grpc.parameters import decode_request_parameters, parse_version
from naiad.types import DataType

_CONTENT_FIELD = {
    DataType.BOOL: "bool_contents", DataType.INT8: "int_contents", DataType.INT16: "int_contents",
    DataType.INT32: "int_contents", DataType.INT64: "int64_contents", DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents", DataType.UINT32: "uint_contents", DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents", DataType.FP64: "fp64_contents", DataType.BYTES: "bytes_contents",
}
_FIELDS = sorted(set(_CONTENT_FIELD.values()))
_FIELD_VALUES = {
    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1), "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(), "bytes_contents": st.binary(max_size=4),
}
# Shapes are int64 on the wire.
_SHAPES = odd_shapes.map(lambda shape: tuple(dim for dim in shape if dim < 2**63))
_PARAMETER_KEYS = ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                   "triton_enable_empty_final_response", "triton_other", "shared_memory_region",
                   "classification", "binary_data", "anything"]


@st.composite
def parameter_values(draw: st.DrawFn) -> pb.InferParameter:
    """An InferParameter with any (or no) choice set."""
    choice = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param", None]))
    values: dict[str, Any] = {
        "bool_param": st.booleans(), "int64_param": st.integers(-(2**63), 2**63 - 1),
        "string_param": st.text(max_size=6), "double_param": st.floats(), "uint64_param": st.integers(0, 2**64 - 1),
    }
    return pb.InferParameter() if choice is None else pb.InferParameter(**{choice: draw(values[choice])})


def _fill_parameters(draw: st.DrawFn, target: Any) -> None:
    for key in draw(st.lists(st.sampled_from(_PARAMETER_KEYS), max_size=3)):
        target[key].CopyFrom(draw(parameter_values()))


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="fuzzed", id=draw(st.text(max_size=4)))
    message.model_version = draw(st.sampled_from(["", "1", "-1", " 2 ", "x", "99999999999999999999999"]))
    raw_mode = draw(st.booleans())
    for index, (datatype, shape, array) in enumerate(draw(st.lists(tensors(), max_size=3))):
        declared = draw(st.sampled_from([datatype, datatype, datatype, draw(st.sampled_from(DATATYPES))]))
        item = message.inputs.add(name=draw(st.sampled_from([f"in{index}", "in0"])), datatype=declared.value,
                                  shape=list(draw(st.sampled_from([shape, shape, draw(_SHAPES)]))))
        if draw(st.integers(0, 9)) == 0:
            _fill_parameters(draw, item.parameters)
        field = _CONTENT_FIELD.get(datatype)
        if raw_mode or field is None:
            message.raw_input_contents.append(draw(mutated(wire(datatype, array))))
            continue
        # The tensor's own values in its field, or values of another field's type in that field.
        chosen = draw(st.sampled_from([field, field, field, *_FIELDS]))
        values = array.reshape(-1).tolist() if chosen == field else draw(st.lists(_FIELD_VALUES[chosen], max_size=6))
        getattr(item.contents, chosen).extend(values)
    if draw(st.integers(0, 4)) == 0:
        message.raw_input_contents.append(draw(st.binary(max_size=8)))
    if draw(st.booleans()):
        _fill_parameters(draw, message.parameters)
    for name in draw(st.lists(st.sampled_from(["out0", "out1"]), max_size=3)):
        output = message.outputs.add(name=name)
        if draw(st.booleans()):
            _fill_parameters(draw, output.parameters)
    return message


def _decode(message: pb.ModelInferRequest) -> None:
    note(f"message: {text_format.MessageToString(message, as_one_line=True, as_utf8=False)}")
    try:
        request = decode_infer_request(message)
    except NaiadError as error:
        check_error(error)
        return
    assert len(request.inputs) == len(message.inputs)
    for tensor in request.inputs:
        if "shared_memory_region" not in tensor.parameters:
            check_array(tensor.datatype, tensor.shape, tensor.data)


@given(infer_requests())
@fuzz_settings(300)
def test_infer_requests(message: pb.ModelInferRequest) -> None:
    _decode(message)


@given(infer_requests().flatmap(lambda message: mutated(message.SerializeToString())))
@fuzz_settings(300)
def test_serialized_requests_with_mutated_bytes(data: bytes) -> None:
    # The transport answers a DecodeError with INTERNAL "failed to parse the request" (wire/call.py).
    try:
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return
    _decode(message)


@given(st.dictionaries(st.sampled_from(_PARAMETER_KEYS), parameter_values(), max_size=4))
@fuzz_settings(200)
def test_request_parameters(parameters: dict[str, pb.InferParameter]) -> None:
    message = pb.ModelInferRequest()
    for key, value in parameters.items():
        message.parameters[key].CopyFrom(value)
    try:
        decoded = decode_request_parameters(message.parameters)
    except NaiadError as error:
        check_error(error)
        return
    assert set(decoded) == {key for key in parameters if not key.startswith("triton_")}


@given(st.text(max_size=24))
@fuzz_settings(200)
def test_model_versions(text: str) -> None:
    try:
        version = parse_version(text)
    except NaiadError as error:
        check_error(error)
        return
    assert version is None or version >= 0
