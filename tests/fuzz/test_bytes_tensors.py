"""Fuzz the BYTES decoder (4-byte little-endian length + bytes per element) and the raw tensor
decoder shared by the HTTP binary extension, gRPC raw contents and shared memory: valid
encodings round-trip; cut, overwritten or extended ones fail with InvalidArgument, or decode to
elements that account for every byte of the buffer."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st

from fuzz.strategies import DATATYPES, check_array, check_error, fuzz_settings, mutated, odd_shapes, shapes, wire
from naiad.errors import NaiadError
from naiad.frontends.tensors import deserialize_bytes_tensor, serialize_bytes_tensor, tensor_from_raw
from naiad.types import DataType

_elements = st.lists(st.binary(max_size=12) | st.text(max_size=6), max_size=8)


@given(_elements)
@fuzz_settings(200)
def test_bytes_round_trip(items: list[bytes | str]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    decoded = deserialize_bytes_tensor(serialize_bytes_tensor(array), len(items))
    expected = [item if isinstance(item, bytes) else item.encode("utf-8", "surrogatepass") for item in items]
    assert list(decoded) == expected


@given(_elements.flatmap(lambda items: st.tuples(st.just(len(items)), mutated(_serialized(items)))),
       st.sampled_from([None, 0, 1, 2]))
@fuzz_settings(400)
def test_mutated_bytes(case: tuple[int, bytes], count_delta: int | None) -> None:
    count, buffer = case
    expected = None if count_delta is None else max(0, count + count_delta - 1)
    try:
        decoded = deserialize_bytes_tensor(buffer, expected)
    except NaiadError as error:
        check_error(error)
        return
    # Every byte accounted for: a length prefix and its element, end to end.
    assert sum(4 + len(item) for item in decoded) == len(buffer)
    assert expected is None or len(decoded) == expected
    position = 0
    for item in decoded:
        assert struct.unpack_from("<I", buffer, position)[0] == len(item)
        assert buffer[position + 4:position + 4 + len(item)] == item
        position += 4 + len(item)


def _serialized(items: list[bytes | str]) -> bytes:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return serialize_bytes_tensor(array)


@given(st.binary(max_size=64), st.one_of(st.none(), st.integers(0, 8)))
@fuzz_settings(200)
def test_random_buffers(buffer: bytes, count: int | None) -> None:
    try:
        decoded = deserialize_bytes_tensor(memoryview(buffer), count)
    except NaiadError as error:
        check_error(error)
        return
    assert sum(4 + len(item) for item in decoded) == len(buffer)


@st.composite
def raw_tensors(draw: st.DrawFn) -> tuple[DataType, tuple[int, ...], bytes]:
    """Wire bytes of a tensor of one shape, declared with that shape or another, perhaps mutated."""
    datatype = draw(st.sampled_from(DATATYPES))
    shape = draw(shapes)
    count = int(np.prod(shape, dtype=np.int64))
    if datatype is DataType.BYTES:
        array = np.empty(count, dtype=object)
        array[:] = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        raw = wire(datatype, array)
    else:
        raw = draw(st.binary(min_size=count * datatype.itemsize, max_size=count * datatype.itemsize))
    declared = draw(st.sampled_from([shape, shape, draw(shapes), draw(odd_shapes)]))
    return datatype, declared, draw(mutated(raw))


@given(raw_tensors())
@fuzz_settings(400)
def test_raw_tensors(case: tuple[DataType, tuple[int, ...], bytes]) -> None:
    datatype, shape, raw = case
    note(f"datatype={datatype} shape={shape} raw={raw!r}")
    try:
        array = tensor_from_raw("x", datatype, shape, raw, "fuzzed")
    except NaiadError as error:
        check_error(error)
        return
    check_array(datatype, shape, array)
    if datatype is not DataType.BYTES:
        assert array.tobytes() == raw
