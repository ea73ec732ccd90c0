"""Raw tensor bytes: BYTES (de)serialization, raw ↔ array, element counts, BF16 helpers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor as client_deserialize
from tritonclient.utils import serialize_byte_tensor as client_serialize

from naiad.errors import InvalidArgument
from naiad.frontends.tensors import (
    INT64_MAX,
    bf16_to_float32,
    byte_size,
    deserialize_bytes_tensor,
    element_count,
    float_to_bf16_bits,
    serialize_bytes_tensor,
    tensor_from_raw,
    tensor_to_raw,
)
from naiad.types import DataType

FIXED = [dt for dt in DataType if dt is not DataType.BYTES]


def _sample(datatype: DataType, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype is DataType.BOOL:
        return (np.arange(count) % 3 == 0).reshape(shape)
    if datatype is DataType.BF16:
        return float_to_bf16_bits(np.linspace(-2, 2, count)).reshape(shape)
    return np.arange(count).astype(datatype.numpy).reshape(shape)


# ----------------------------------------------------------------------------- BYTES elements


def test_serialize_matches_tritonclient() -> None:
    array = np.array([[b"ab", b""], [b"\x00\xff", "h\u00e9"]], dtype=object)
    assert serialize_bytes_tensor(array) == client_serialize(array).item()
    assert serialize_bytes_tensor(array) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\x00\xff" + b"\x03\x00\x00\x00h\xc3\xa9"
    )


def test_serialize_is_row_major_for_non_contiguous_views() -> None:
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object).T
    assert deserialize_bytes_tensor(serialize_bytes_tensor(array)).tolist() == [b"a", b"c", b"b", b"d"]


def test_serialize_numpy_string_arrays() -> None:
    assert serialize_bytes_tensor(np.array([b"xy"])) == b"\x02\x00\x00\x00xy"
    assert serialize_bytes_tensor(np.array(["xy"])) == b"\x02\x00\x00\x00xy"


def test_deserialize_round_trip_and_client_compat() -> None:
    array = np.array([b"one", b"", b"\x00three"], dtype=object)
    raw = client_serialize(array).item()
    out = deserialize_bytes_tensor(raw)
    assert out.dtype == object and out.tolist() == [b"one", b"", b"\x00three"]
    assert deserialize_bytes_tensor(memoryview(raw), count=3).tolist() == out.tolist()
    assert client_deserialize(serialize_bytes_tensor(out)).tolist() == out.tolist()


def test_deserialize_empty() -> None:
    assert deserialize_bytes_tensor(b"").shape == (0,)
    assert deserialize_bytes_tensor(b"", count=0).shape == (0,)


@pytest.mark.parametrize(
    ("raw", "count", "message"),
    [
        (b"\x01\x00", None, "element byte size indicator exceeds the end of the buffer"),
        (b"\x01\x00\x00\x00a\x05", None, "element byte size indicator exceeds the end of the buffer"),
        (
            b"\x05\x00\x00\x00ab",
            None,
            "incomplete string data, expecting string of length 5 but only 2 bytes available",
        ),
        (b"\x01\x00\x00\x00a", 2, "expected 2 string elements, got 1"),
        (b"\x01\x00\x00\x00a\x01\x00\x00\x00b", 1, "unexpected number of string elements 2, expecting 1"),
    ],
)
def test_deserialize_errors(raw: bytes, count: int | None, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        deserialize_bytes_tensor(raw, count)
    assert str(info.value) == message


# ----------------------------------------------------------------------------- element counts


def test_element_count() -> None:
    assert element_count([], "x", "m") == 1
    assert element_count([2, 0, 5], "x", "m") == 0
    assert element_count((4, 16), "x", "m") == 64


def test_element_count_overflow() -> None:
    with pytest.raises(InvalidArgument) as info:
        element_count([2**4, 2**60 + 2], "INPUT0", "m")
    assert str(info.value) == (
        "The shape [16,1152921504606846978] of input 'INPUT0' for model 'm' causes total element "
        f"count to exceed maximum size of {INT64_MAX}"
    )


def test_element_count_negative() -> None:
    with pytest.raises(InvalidArgument) as info:
        element_count([2, -5], "INPUT0", "m")
    assert str(info.value) == "input 'INPUT0' for model 'm' has a negative dimension in shape [2,-5]"


def test_byte_size_overflow() -> None:
    assert byte_size(DataType.FP32, 8, "x", "m") == 32
    assert byte_size(DataType.BYTES, 8, "x", "m") == 0
    with pytest.raises(InvalidArgument) as info:
        byte_size(DataType.FP32, 2**2 * (2**60 + 2), "INPUT0", "m")
    assert str(info.value) == "byte size overflow for input 'INPUT0' for model 'm'"


# ----------------------------------------------------------------------------- raw <-> array


@pytest.mark.parametrize("datatype", FIXED, ids=lambda d: d.value)
def test_fixed_round_trip(datatype: DataType) -> None:
    array = _sample(datatype, (2, 3))
    raw = tensor_to_raw(array, datatype)
    assert isinstance(raw, memoryview) and len(raw) == array.nbytes
    assert bytes(raw) == array.astype(datatype.numpy.newbyteorder("<")).tobytes()
    back = tensor_from_raw("x", datatype, (2, 3), bytes(raw), "m")
    assert back.dtype == datatype.numpy and back.shape == (2, 3)
    np.testing.assert_array_equal(back, array)


def test_from_raw_is_zero_copy() -> None:
    body = bytearray(np.arange(4, dtype=np.float32).tobytes())
    array = tensor_from_raw("x", DataType.FP32, (4,), memoryview(body), "m")
    body[0:4] = np.float32(7).tobytes()
    assert array[0] == 7


def test_to_raw_is_zero_copy_for_contiguous_arrays() -> None:
    array = np.arange(4, dtype=np.float32)
    raw = tensor_to_raw(array, DataType.FP32)
    array[0] = 9
    assert np.frombuffer(raw, dtype=np.float32)[0] == 9


def test_to_raw_converts_non_contiguous_and_big_endian() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T
    assert bytes(tensor_to_raw(array, DataType.INT32)) == np.ascontiguousarray(array).tobytes()
    big = np.arange(3, dtype=">i4")
    assert bytes(tensor_to_raw(big, DataType.INT32)) == np.arange(3, dtype="<i4").tobytes()


def test_to_raw_empty_and_scalar() -> None:
    assert tensor_to_raw(np.zeros((0, 3), np.float32), DataType.FP32) == b""
    assert bytes(tensor_to_raw(np.array(1.5, np.float32), DataType.FP32)) == np.float32(1.5).tobytes()


def test_bytes_round_trip() -> None:
    array = np.array([[b"a", b"bc"], [b"", b"\xff"]], dtype=object)
    raw = tensor_to_raw(array, DataType.BYTES)
    back = tensor_from_raw("x", DataType.BYTES, (2, 2), raw, "m")
    assert back.shape == (2, 2) and back.tolist() == array.tolist()


def test_from_raw_byte_size_mismatch() -> None:
    with pytest.raises(InvalidArgument) as info:
        tensor_from_raw("INPUT0", DataType.FP32, (8,), b"\x00" * 40, "m")
    assert str(info.value) == "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 32, got 40"


def test_from_raw_string_count_mismatch() -> None:
    raw = serialize_bytes_tensor(np.array([b"x"] * 14, dtype=object))
    with pytest.raises(InvalidArgument) as info:
        tensor_from_raw("INPUT1", DataType.BYTES, (16,), raw, "m")
    assert str(info.value) == "expected 16 string elements for inference input 'INPUT1' for model 'm', got 14"


def test_from_raw_too_many_strings() -> None:
    raw = serialize_bytes_tensor(np.array([b"x"] * 3, dtype=object))
    with pytest.raises(InvalidArgument) as info:
        tensor_from_raw("INPUT1", DataType.BYTES, (2,), raw, "m")
    assert str(info.value) == (
        "unexpected number of string elements 3 for inference input 'INPUT1' for model 'm', expecting 2"
    )


# ----------------------------------------------------------------------------- BF16


def test_bf16_bits_match_ml_dtypes() -> None:
    values = np.array([0.0, -0.0, 1.0, -2.5, 3.14159, 1e-40, 65504.0, 1e38, np.inf, -np.inf], np.float32)
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(float_to_bf16_bits(values), expected)
    nan_bits = float_to_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(bf16_to_float32(nan_bits)).all()


def test_bf16_to_float32() -> None:
    bits = np.array([0x3F80, 0xC020], np.uint16)
    assert bf16_to_float32(bits).tolist() == [1.0, -2.5]
    assert bf16_to_float32(bits.view(ml_dtypes.bfloat16)).tolist() == [1.0, -2.5]


def test_bf16_to_raw_accepts_ml_dtypes_and_floats() -> None:
    values = np.array([1.0, -2.5], np.float32)
    expected = values.astype(ml_dtypes.bfloat16).tobytes()
    assert bytes(tensor_to_raw(values.astype(ml_dtypes.bfloat16), DataType.BF16)) == expected
    assert bytes(tensor_to_raw(values, DataType.BF16)) == expected
    assert bytes(tensor_to_raw(np.array([0x3F80, 0xC020], np.uint16), DataType.BF16)) == expected


def test_from_raw_trusts_a_given_count() -> None:
    raw = np.arange(6, dtype=np.int16).tobytes()
    assert tensor_from_raw("x", DataType.INT16, (2, 3), raw, "m", count=6).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_from_raw_empty_tensor_with_a_dim_numpy_cannot_hold() -> None:
    # Found by tests/fuzz/test_bytes_tensors.py: numpy raised "Maximum allowed dimension exceeded".
    with pytest.raises(InvalidArgument) as info:
        tensor_from_raw("x", DataType.BOOL, (0, 9223372036854775808), b"", "fuzzed")
    assert str(info.value) == (
        "The shape [0,9223372036854775808] of input 'x' for model 'fuzzed' is too large: its non-zero "
        "dimensions exceed the maximum size of 9223372036854775807 bytes"
    )


@pytest.mark.parametrize("datatype", [DataType.BYTES, DataType.FP64])
def test_from_raw_empty_tensor_whose_other_dims_pass_int64_bytes(datatype: DataType) -> None:
    # 2**60 elements of 8 bytes (BYTES are 8-byte object pointers) is past int64 bytes.
    with pytest.raises(InvalidArgument, match="is too large"):
        tensor_from_raw("x", datatype, (2**60, 0), b"", "m")
    assert tensor_from_raw("x", DataType.INT8, (2**60, 0), b"", "m").shape == (2**60, 0)
