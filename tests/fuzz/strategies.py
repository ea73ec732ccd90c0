"""Hypothesis strategies shared by the fuzz tests: tensors as clients send them, and byte-level
mutations (truncation, bit flips, splices) of valid wire data."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from naiad.errors import NaiadError
from naiad.frontends.tensors import serialize_bytes_tensor, tensor_to_raw
from naiad.types import DataType

DATATYPES = list(DataType)
# Small shapes keep each example fast; zero dims are where size arithmetic goes wrong.
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
# Declared shapes that need not match the data: zero dims beside huge ones, int64 edges.
odd_shapes = st.lists(
    st.sampled_from([0, 0, 1, 2, 3, -1, 2**31, 2**32 + 1, 2**60, 2**62, 2**63 - 1, 2**63, 2**64]), max_size=4
).map(tuple)


@st.composite
def tensors(draw: st.DrawFn, datatype: DataType | None = None) -> tuple[DataType, tuple[int, ...], np.ndarray]:
    """(datatype, shape, array) with values anywhere in the datatype's range."""
    datatype = datatype or draw(st.sampled_from(DATATYPES))
    shape = draw(shapes)
    count = int(np.prod(shape, dtype=np.int64))
    if datatype is DataType.BYTES:
        items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        array = np.empty(count, dtype=object)
        array[:] = items
        return datatype, shape, array.reshape(shape)
    dtype = np.dtype(np.uint16) if datatype is DataType.BF16 else datatype.numpy
    raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if datatype is DataType.BOOL:
        array = array.view(np.uint8) % 2 == 1
    return datatype, shape, array


def wire(datatype: DataType, array: np.ndarray) -> bytes:
    """The tensor's bytes as the binary extension and raw_input_contents carry them."""
    if datatype is DataType.BYTES:
        return serialize_bytes_tensor(array)
    return bytes(tensor_to_raw(array, datatype))


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` cut short, extended, with bytes overwritten or a slice removed."""
    how = draw(st.sampled_from(["truncate", "extend", "overwrite", "delete", "same"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if how == "extend":
        return data + draw(st.binary(min_size=1, max_size=16))
    if how == "overwrite" and data:
        at = draw(st.integers(0, len(data) - 1))
        patch = draw(st.binary(min_size=1, max_size=8))
        return data[:at] + patch + data[at + len(patch):]
    if how == "delete" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + data[at + draw(st.integers(1, 8)):]
    return data


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value: where a decoder expects one type, it meets all the others."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
        max_leaves=max_leaves,
    )


def check_error(error: NaiadError) -> None:
    """A decode error a client can act on: one of naiad's, with a message."""
    assert isinstance(error, NaiadError)
    assert error.message.strip(), f"{type(error).__name__} without a message"


def check_array(datatype: DataType, shape: tuple[int, ...], data: np.ndarray) -> None:
    """A decoded tensor agrees with its declared shape and datatype (size = elements * itemsize)."""
    assert tuple(data.shape) == tuple(shape), (data.shape, shape)
    if datatype is DataType.BYTES:
        assert data.dtype == object
        assert all(isinstance(item, bytes) for item in data.flat)
    else:
        expected = np.dtype(np.uint16) if datatype is DataType.BF16 else datatype.numpy
        assert data.dtype.newbyteorder("=") == expected.newbyteorder("="), (data.dtype, datatype)
        assert data.nbytes == int(np.prod(shape, dtype=np.int64)) * expected.itemsize


def fuzz_settings(max_examples: int) -> settings:
    """Bounded runs for CI (2 cores): the same examples every run (a failure reproduces; CI never
    flakes on a new one), no deadline (a shared runner stalls), no example database in the tree.

    NAIAD_FUZZ_SCALE=N explores instead: N times the examples, from a random seed each run.
    """
    scale = int(os.environ.get("NAIAD_FUZZ_SCALE", "1"))
    return settings(
        max_examples=max_examples * scale,
        derandomize=scale == 1,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
