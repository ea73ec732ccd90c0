"""Typed `InferTensorContents` (bool_contents, int_contents, ... bytes_contents) → numpy.

Each content field carries one wire type: INT8/INT16 travel in int_contents (int32 values),
UINT8/UINT16 in uint_contents; FP16 and BF16 have no field and must come as raw contents.
Texts follow Triton's InferGRPCToInput.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.errors import InvalidArgument
from naiad.frontends.tensors import check_empty_shape, element_count
from naiad.types import DataType

_D = DataType
# Content fields in the order Triton reads them, with the numpy type of their values.
_FIELDS: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("bool_contents", np.dtype(np.bool_)),
    ("int_contents", np.dtype(np.int32)),
    ("int64_contents", np.dtype(np.int64)),
    ("uint_contents", np.dtype(np.uint32)),
    ("uint64_contents", np.dtype(np.uint64)),
    ("fp32_contents", np.dtype(np.float32)),
    ("fp64_contents", np.dtype(np.float64)),
    ("bytes_contents", np.dtype(object)),
)
_FIXED_FIELD_TYPE = {
    "bool_contents": _D.BOOL, "int64_contents": _D.INT64, "uint64_contents": _D.UINT64,
    "fp32_contents": _D.FP32, "fp64_contents": _D.FP64, "bytes_contents": _D.BYTES,
}


def _field_type(field: str, datatype: DataType) -> DataType:
    """The datatype a field's values stand for, given the tensor's declared datatype."""
    if field == "int_contents":
        return datatype if datatype in (_D.INT8, _D.INT16) else _D.INT32
    if field == "uint_contents":
        return datatype if datatype in (_D.UINT8, _D.UINT16) else _D.UINT32
    return _FIXED_FIELD_TYPE[field]


def contents_array(
    contents: pb.InferTensorContents, name: str, datatype: DataType, shape: tuple[int, ...], model_name: str
) -> np.ndarray:
    """The tensor held in typed contents, checked against its datatype and shape."""
    count = element_count(shape, name, model_name)
    if count == 0:
        check_empty_shape(shape, datatype, name, model_name)
    found: Any = ()
    found_dtype = datatype.numpy
    for field, dtype in _FIELDS:
        values = getattr(contents, field)
        if not values:
            continue
        if len(found):
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model_name}', "
                "binary data was already supplied."
            )
        field_type = _field_type(field, datatype)
        if field_type is not datatype:
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model_name}' of type "
                f"'{field_type.value}', expected datatype '{datatype.value}'"
            )
        found, found_dtype = values, dtype
    if datatype is _D.BYTES:
        return _bytes_array(list(found), count, name, model_name).reshape(shape)
    array = np.array(found, dtype=found_dtype)
    if array.size != count:
        itemsize = datatype.itemsize
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {count * itemsize}, got {array.size * itemsize}"
        )
    # int_contents / uint_contents keep the low bytes for 8- and 16-bit types, as Triton does.
    return array.astype(datatype.numpy, copy=False).reshape(shape)


def _bytes_array(items: list[bytes], count: int, name: str, model_name: str) -> np.ndarray:
    where = f" for inference input '{name}' for model '{model_name}'"
    if len(items) > count:
        raise InvalidArgument(f"unexpected number of string elements {count + 1}{where}, expecting {count}")
    if len(items) < count:
        raise InvalidArgument(f"expected {count} string elements{where}, got {len(items)}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array
