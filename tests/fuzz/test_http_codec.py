"""Fuzz the KServe V2 HTTP request decoder (JSON body + binary tensor extension) and the raw
binary request decoder: every input decodes to tensors that agree with their declared shape and
datatype, or fails with a NaiadError that has a message — never another exception."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st

from fuzz.strategies import (
    DATATYPES,
    check_array,
    check_error,
    fuzz_settings,
    json_values,
    mutated,
    odd_shapes,
    tensors,
    wire,
)
from naiad.errors import NaiadError
from naiad.frontends.http.codec import decode_infer_request, decode_raw_request
from naiad.frontends.tensors import bf16_to_float32
from naiad.types import DataType, InferRequest, TensorSpec

MODEL = "fuzzed"


def _decode(body: bytes, header_length: int | None) -> InferRequest | None:
    note(f"body={body!r} header_length={header_length}")  # shown with a failing example
    try:
        request = decode_infer_request(body, header_length, MODEL, None)
    except NaiadError as error:
        check_error(error)
        return None
    for tensor in request.inputs:
        if "shared_memory_region" not in tensor.parameters:
            check_array(tensor.datatype, tensor.shape, tensor.data)
    return request


def _json_data(datatype: DataType, array: np.ndarray) -> list[Any]:
    if datatype is DataType.BYTES:
        return [item.decode("utf-8", "replace") for item in array.flat]
    if datatype is DataType.BF16:
        return bf16_to_float32(array).ravel().tolist()
    return array.ravel().tolist()


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid binary-extension request, then perhaps a wrong header length, a wrong
    binary_data_size, or a mutated binary section."""
    items = draw(st.lists(tensors(), min_size=1, max_size=3))
    inputs, blobs = [], []
    for index, (datatype, shape, array) in enumerate(items):
        raw = wire(datatype, array)
        size = len(raw) + draw(st.sampled_from([0, 0, 0, -1, 1, -4, 4]))
        shape = draw(st.sampled_from([shape, shape, draw(odd_shapes)]))
        inputs.append({"name": f"in{index}", "datatype": datatype.value, "shape": list(shape),
                       "parameters": {"binary_data_size": size}})
        blobs.append(raw)
    header = json.dumps({"inputs": inputs, "outputs": [{"name": "out", "parameters": {"binary_data": True}}]})
    header_bytes = header.encode()
    binary = draw(mutated(b"".join(blobs)))
    length = len(header_bytes) + draw(st.sampled_from([0, 0, 0, -1, 1, -len(header_bytes) - 1, 10**6]))
    return header_bytes + binary, draw(st.sampled_from([length, length, None]))


@given(binary_requests())
@fuzz_settings(300)
def test_binary_extension_requests(case: tuple[bytes, int | None]) -> None:
    _decode(*case)


@st.composite
def json_requests(draw: st.DrawFn) -> bytes:
    """A valid all-JSON request (NaN / Infinity literals included), then perhaps mutated bytes."""
    items = draw(st.lists(tensors(), min_size=1, max_size=3))
    inputs = [
        {"name": f"in{index}", "datatype": datatype.value, "shape": list(shape), "data": _json_data(datatype, array)}
        for index, (datatype, shape, array) in enumerate(items)
    ]
    body = json.dumps({"id": "x", "inputs": inputs}).encode()
    return draw(mutated(body))


@given(json_requests())
@fuzz_settings(300)
def test_json_requests(body: bytes) -> None:
    _decode(body, None)


_FIELDS = ("name", "datatype", "shape", "data", "parameters")


@st.composite
def odd_headers(draw: st.DrawFn) -> bytes:
    """Structurally plausible headers whose fields hold any JSON value, of any type."""
    def field(name: str) -> Any:
        # Mostly the right JSON type (so decoding gets past the first check), sometimes any value.
        typed = draw(st.integers(0, 3)) > 0
        if name == "name" and typed:
            return draw(st.text(max_size=4))
        if name == "datatype" and typed:
            return draw(st.sampled_from(DATATYPES)).value
        if name == "shape" and typed:
            return list(draw(odd_shapes))
        if name == "data" and typed:
            return draw(st.lists(json_values(1), max_size=4))
        if name == "parameters" and typed:
            return draw(st.dictionaries(
                st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_offset",
                                 "shared_memory_byte_size", "classification", "binary_data", "x"]),
                json_values(4), max_size=3))
        return draw(json_values(4))

    def item(fields: tuple[str, ...]) -> dict[str, Any]:
        # A field may be missing; parameters often are (they mostly hold a second content field).
        return {name: field(name) for name in fields if draw(st.integers(0, 9)) > (4 if name == "parameters" else 0)}

    inputs = [item(_FIELDS) for _ in range(draw(st.integers(0, 2)))]
    outputs = [item(("name", "parameters")) for _ in range(draw(st.integers(0, 2)))]
    document: dict[str, Any] = {"inputs": inputs if draw(st.booleans()) else draw(json_values())}
    if draw(st.booleans()):
        document["outputs"] = outputs
    if draw(st.booleans()):
        document["parameters"] = draw(st.dictionaries(
            st.sampled_from(["sequence_id", "sequence_start", "priority", "timeout", "triton_x", "k"]),
            json_values(4), max_size=3))
    if draw(st.booleans()):
        document["id"] = draw(json_values(2))
    return json.dumps(document).encode()


@given(odd_headers(), st.binary(max_size=32))
@fuzz_settings(400)
def test_headers_of_any_shape(header: bytes, binary: bytes) -> None:
    _decode(header + binary, len(header))


@given(st.binary(max_size=256), st.one_of(st.none(), st.integers(-2, 300)))
@fuzz_settings(200)
def test_random_bytes(body: bytes, header_length: int | None) -> None:
    _decode(body, header_length)


@given(
    st.sampled_from(DATATYPES),
    st.lists(st.sampled_from([-1, 0, 1, 2, 3, 7]), max_size=3),
    st.booleans(),
    st.binary(max_size=64),
    st.integers(1, 2),
)
@fuzz_settings(300)
def test_raw_requests(datatype: DataType, dims: list[int], batching: bool, body: bytes, input_count: int) -> None:
    spec = TensorSpec("raw", datatype, tuple([-1, *dims] if batching else dims))
    note(f"spec={spec} body={body!r}")
    try:
        request = decode_raw_request(body, spec, input_count, MODEL, None, batching=batching)
    except NaiadError as error:
        check_error(error)
        return
    (tensor,) = request.inputs
    check_array(tensor.datatype, tensor.shape, tensor.data)
    assert all(dim >= 0 for dim in tensor.shape)
    if datatype is DataType.BYTES:
        assert tensor.data.reshape(-1)[0] == body
    else:
        assert tensor.data.nbytes == len(body)
