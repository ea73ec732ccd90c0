"""Raw tensor bytes on the wire, shared by the HTTP binary extension and gRPC raw contents.

Wire layout (both protocols): little-endian, row-major, no padding; BOOL is one byte per
element; a BYTES element is a 4-byte little-endian length followed by that many bytes.
BF16 travels as its raw 16 bits, which is also how naiad holds it (a uint16 array).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from naiad.errors import InvalidArgument
from naiad.types import DataType

INT64_MAX = 2**63 - 1

_U32 = struct.Struct("<I")
_BYTES = DataType.BYTES
_BF16 = DataType.BF16
# numpy dtypes pinned to little-endian so the wire layout holds on any host.
_WIRE_DTYPE: dict[DataType, np.dtype[Any]] = {
    dt: dt.numpy.newbyteorder("<") for dt in DataType if dt is not DataType.BYTES
}


def element_count(shape: Sequence[int], name: str, model_name: str) -> int:
    """Number of elements in `shape`; InvalidArgument for a negative dim or an int64 overflow."""
    count = 1
    for dim in shape:
        if dim < 0:
            raise InvalidArgument(
                f"input '{name}' for model '{model_name}' has a negative dimension in shape {_dims(shape)}"
            )
        count *= dim
        if count > INT64_MAX:
            raise InvalidArgument(
                f"The shape {_dims(shape)} of input '{name}' for model '{model_name}' causes total "
                f"element count to exceed maximum size of {INT64_MAX}"
            )
    return count


def check_empty_shape(shape: Sequence[int], datatype: DataType, name: str, model_name: str) -> None:
    """InvalidArgument for an empty tensor (a zero dim) numpy cannot shape: numpy multiplies the
    non-zero dims and the itemsize (8 for BYTES objects) and refuses a product past int64."""
    size = datatype.numpy.itemsize
    for dim in shape:
        size *= dim or 1
        if size > INT64_MAX:
            raise InvalidArgument(
                f"The shape {_dims(shape)} of input '{name}' for model '{model_name}' is too large: its "
                f"non-zero dimensions exceed the maximum size of {INT64_MAX} bytes"
            )


def byte_size(datatype: DataType, count: int, name: str, model_name: str) -> int:
    """Bytes needed by `count` fixed-size elements; InvalidArgument past int64 (0 for BYTES)."""
    size = 0 if datatype is _BYTES else count * _WIRE_DTYPE[datatype].itemsize
    if size > INT64_MAX:
        raise InvalidArgument(f"byte size overflow for input '{name}' for model '{model_name}'")
    return size


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor, row-major, each element as a 4-byte LE length plus its bytes.

    Elements may be bytes or str (encoded as UTF-8); anything else is written as its str().
    """
    pack = _U32.pack
    parts: list[bytes] = []
    for item in np.asarray(array).flat:
        if not isinstance(item, bytes | bytearray):
            item = (item if isinstance(item, str) else str(item)).encode("utf-8", "surrogatepass")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Split serialized BYTES elements into a 1-D object array of bytes.

    With `count`, the buffer must hold exactly that many elements. InvalidArgument when a length
    prefix is cut off, an element runs past the end, or the count does not match.
    """
    return _split_bytes(buffer, count, "")


def _split_bytes(buffer: bytes | memoryview, count: int | None, where: str) -> np.ndarray:
    """deserialize_bytes_tensor; `where` (" for inference input 'X' ...") names the tensor."""
    view = memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else buffer
    end = len(view)
    unpack_from = _U32.unpack_from
    items: list[bytes] = []
    offset = 0
    while offset < end:
        if count is not None and len(items) == count:
            raise InvalidArgument(f"unexpected number of string elements {count + 1}{where}, expecting {count}")
        if end - offset < 4:
            raise InvalidArgument(f"element byte size indicator exceeds the end of the buffer{where}")
        (length,) = unpack_from(view, offset)
        offset += 4
        if end - offset < length:
            raise InvalidArgument(
                f"incomplete string data{where}, expecting string of length {length} but only "
                f"{end - offset} bytes available"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise InvalidArgument(f"expected {count} string elements{where}, got {len(items)}")
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def tensor_from_raw(
    name: str,
    datatype: DataType,
    shape: Sequence[int],
    raw: bytes | memoryview,
    model_name: str,
    *,
    count: int | None = None,
) -> np.ndarray:
    """Build the array for one input from its wire bytes, checked against `shape`.

    Fixed-size types are a zero-copy view of `raw` (read-only when `raw` is); BYTES become an
    object array. `count` is the element count of `shape` when the caller already checked it.
    """
    if count is None:
        count = element_count(shape, name, model_name)
    if count == 0:
        check_empty_shape(shape, datatype, name, model_name)
    if datatype is _BYTES:
        where = f" for inference input '{name}' for model '{model_name}'"
        return _split_bytes(raw, count, where).reshape(shape)
    dtype = _WIRE_DTYPE[datatype]
    expected = count * dtype.itemsize
    if expected > INT64_MAX:
        raise InvalidArgument(f"byte size overflow for input '{name}' for model '{model_name}'")
    got = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if got != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. Expected {expected}, got {got}"
        )
    return np.ndarray(shape, dtype, raw)


def tensor_to_raw(array: np.ndarray, datatype: DataType) -> bytes | memoryview:
    """Wire bytes of one tensor: a flat memoryview (no copy) of a C-contiguous little-endian
    array, else a converted copy. BF16 accepts raw uint16 bits, ml_dtypes.bfloat16 or floats."""
    if datatype is _BYTES:
        return serialize_bytes_tensor(array)
    array = np.asarray(array)
    if datatype is _BF16 and array.dtype != np.uint16:
        array = _as_bf16_bits(array)
    array = np.ascontiguousarray(array, dtype=_WIRE_DTYPE[datatype])
    if array.nbytes == 0:
        return b""
    return array.data.cast("B")


def float_to_bf16_bits(array: Any) -> np.ndarray:
    """Round float values to bfloat16 (nearest even) and return their raw bits as uint16."""
    bits = np.asarray(array, dtype=np.float32).view(np.uint32)
    nan = np.isnan(bits.view(np.float32))
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    out = rounded.astype(np.uint16)
    if nan.any():
        # Rounding could carry a NaN payload into infinity; keep it a quiet NaN.
        out[nan] = (bits[nan] >> 16).astype(np.uint16) | np.uint16(0x40)
    return out


def bf16_to_float32(array: np.ndarray) -> np.ndarray:
    """The float32 values of a BF16 tensor given as raw uint16 bits, ml_dtypes.bfloat16 or
    floats (exact for the first two)."""
    array = np.asarray(array)
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def _as_bf16_bits(array: np.ndarray) -> np.ndarray:
    if array.dtype.name == "bfloat16":  # ml_dtypes.bfloat16 holds the same 16 bits
        return array.view(np.uint16)
    return float_to_bf16_bits(array)


def _dims(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
