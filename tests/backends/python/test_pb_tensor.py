"""pb_utils' tensors and type helpers: dtypes, BYTES serialization, Tensor, DLPack."""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import numpy as np
import pytest

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# -- constants and type helpers --------------------------------------------------------------


def test_constants_have_upstream_values() -> None:
    assert (pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
            pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END) == (1, 1, 2)
    assert (pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL, pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) == (1, 2)
    # upstream's PreferredMemory enum, not TRITONSERVER_MemoryType
    assert (pb_utils.TRITONSERVER_MEMORY_GPU, pb_utils.TRITONSERVER_MEMORY_CPU) == (0, 1)
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
    assert (memory.preferred_memory_type, memory.preferred_device_id) == (0, 1)
    codes = [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.INTERNAL, pb_utils.TritonError.NOT_FOUND,
             pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNAVAILABLE, pb_utils.TritonError.UNSUPPORTED,
             pb_utils.TritonError.ALREADY_EXISTS, pb_utils.TritonError.CANCELLED]
    assert codes == list(range(8))
    logger = pb_utils.Logger
    assert (logger.INFO, logger.WARNING, logger.ERROR, logger.VERBOSE) == (0, 1, 2, 3)
    assert (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM) == (0, 1, 2)


def test_dtype_helpers_round_trip() -> None:
    for value in range(1, 13):
        numpy_type = pb_utils.triton_to_numpy_type(value)
        assert pb_utils.numpy_to_triton_type(numpy_type) == value
        assert pb_utils.numpy_to_triton_type(np.dtype(numpy_type)) == value
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.triton_to_numpy_type(0) is None and pb_utils.triton_to_numpy_type(99) is None
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    for name, numpy_type in pb_utils.TRITON_STRING_TO_NUMPY.items():
        assert pb_utils.triton_string_to_numpy(name) is numpy_type
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool  # upstream's table says bool, not np.bool_
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


# -- BYTES serialization ---------------------------------------------------------------------


@pytest.mark.parametrize("items", [
    [b"abc", b"", "héllo wörld ✓".encode(), b"\x00nul\x00inside\x00"],
    [b"same", b"size"],  # equal lengths must not turn into a 2-D array
    [b""],
])
def test_bytes_round_trip(items: list[bytes]) -> None:
    array = np.array([*items, None], dtype=np.object_)[:-1]
    wire = pb_utils.serialize_byte_tensor(array)
    assert wire == b"".join(struct.pack("<I", len(item)) + item for item in items)
    back = pb_utils.deserialize_bytes_tensor(wire)
    assert back.dtype == np.object_ and back.shape == (len(items),)
    assert back.tolist() == items
    # the model process hands a uint8 view of shared memory, not bytes
    assert pb_utils.deserialize_bytes_tensor(np.frombuffer(wire, np.uint8)).tolist() == items


def test_bytes_serialization_of_empty_str_and_fixed_width_tensors() -> None:
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == b""
    assert pb_utils.deserialize_bytes_tensor(b"").shape == (0,)
    # str elements go as UTF-8, anything else as str(); C order for any shape
    mixed = np.array([["é", 7], [b"x", 1.5]], dtype=np.object_)
    assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(mixed)).tolist() == [
        "é".encode(), b"7", b"x", b"1.5"]
    # np.bytes_ elements are bytes, not their repr
    assert pb_utils.serialize_byte_tensor(np.array([np.bytes_(b"ab")], dtype=np.object_)) == b"\x02\x00\x00\x00ab"
    # 'S' arrays work; numpy drops their trailing NULs
    fixed = np.array([b"ab\x00", b"c"], dtype="S3")
    assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(fixed)).tolist() == [b"ab", b"c"]
    assert pb_utils.serialize_byte_tensor(np.zeros(3, np.float32)) is None


def test_truncated_bytes_tensor_raises_struct_error() -> None:
    with pytest.raises(struct.error):
        pb_utils.deserialize_bytes_tensor(struct.pack("<I", 5) + b"abc")
    with pytest.raises(struct.error):
        pb_utils.deserialize_bytes_tensor(b"\x01\x00")


# -- Tensor ----------------------------------------------------------------------------------


def test_tensor_keeps_the_array_it_is_given() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = pb_utils.Tensor("A", array)
    assert tensor.as_numpy() is array and np.shares_memory(tensor.as_numpy(), array)
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype(), tensor.is_cpu()) == ("A", [3, 4], 11, True)
    view = np.frombuffer(bytearray(16), np.int32)  # like a view of shared memory
    assert pb_utils.Tensor("V", view).as_numpy() is view
    # only a non C-contiguous array is copied, as upstream
    strided = array[:, ::2]
    contiguous = pb_utils.Tensor("S", strided).as_numpy()
    assert contiguous.flags.c_contiguous and not np.shares_memory(contiguous, array)
    assert np.array_equal(contiguous, strided)
    assert pb_utils.Tensor("L", [1, 2, 3]).triton_dtype() == 9  # array-likes convert, as pybind's py::array
    assert pb_utils.Tensor("Z", np.float64(2.0)).shape() == []


def test_tensor_dtypes_and_bytes() -> None:
    objects = np.array([b"a", "b"], dtype=np.object_)
    assert pb_utils.Tensor("B", objects).triton_dtype() == 13
    assert pb_utils.Tensor("B", objects).as_numpy() is objects
    assert pb_utils.Tensor("S", np.array([b"x"], dtype="S1")).triton_dtype() == 13
    assert pb_utils.Tensor("T", np.array([True])).triton_dtype() == 1
    with pytest.raises(E, match=r"^NumPy dtype is not supported\.$"):
        pb_utils.Tensor("U", np.array(["text"]))  # unicode arrays: use dtype=np.object_
    with pytest.raises(E, match="NumPy dtype is not supported"):
        pb_utils.Tensor("C", np.zeros(2, np.complex64))
    with pytest.raises(E, match="NumPy dtype is not supported"):
        pb_utils.Tensor("BE", np.zeros(2, ">i4"))
    with pytest.raises(E, match=r"^Tensor name cannot be an empty string\.$"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, np.zeros(1))  # type: ignore[arg-type]


def test_dlpack_out_shares_memory() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    tensor = pb_utils.Tensor("A", array)
    capsule = tensor.to_dlpack()
    assert type(capsule).__name__ == "PyCapsule"
    assert tensor.__dlpack_device__() == (1, 0)
    taken = np.from_dlpack(tensor)  # the __dlpack__ protocol
    assert np.shares_memory(taken, array) and np.array_equal(taken, array)
    readonly = np.arange(3.0)
    readonly.flags.writeable = False
    assert np.array_equal(np.from_dlpack(pb_utils.Tensor("R", readonly)), readonly)
    with pytest.raises(E, match=r"^DLPack does not have support for string tensors\.$"):
        pb_utils.Tensor("B", np.array([b"x"], dtype=np.object_)).to_dlpack()


def test_dlpack_in_from_capsule_and_from_producers() -> None:
    array = np.arange(8, dtype=np.float32).reshape(2, 4)
    from_capsule = pb_utils.Tensor.from_dlpack("C", array.__dlpack__())
    assert np.shares_memory(from_capsule.as_numpy(), array)
    assert (from_capsule.name(), from_capsule.shape(), from_capsule.triton_dtype()) == ("C", [2, 4], 11)
    from_producer = pb_utils.Tensor.from_dlpack("P", array)
    assert np.shares_memory(from_producer.as_numpy(), array)
    round_trip = pb_utils.Tensor.from_dlpack("R", pb_utils.Tensor("X", array).to_dlpack())
    assert np.shares_memory(round_trip.as_numpy(), array)


def test_dlpack_in_refusals() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(E, match=r"^DLPack tensor is not contiguous\. Only contiguous DLPack tensors"):
        pb_utils.Tensor.from_dlpack("T", array.T)
    capsule = array.__dlpack__()
    pb_utils.Tensor.from_dlpack("once", capsule)
    with pytest.raises(E, match="can be taken only once"):
        pb_utils.Tensor.from_dlpack("twice", capsule)
    with pytest.raises(E, match="Tensor must be a DLPack capsule or have a `__dlpack__` attribute"):
        pb_utils.Tensor.from_dlpack("N", [1, 2])
    with pytest.raises(E, match="Tensor name cannot be an empty string"):
        pb_utils.Tensor.from_dlpack("", array)

    class CudaProducer:
        def __dlpack__(self, stream: Any = None) -> Any:
            raise AssertionError("must not be consumed")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 1)

    with pytest.raises(E, match=r"DLPack tensor is in CUDA memory \(device 1\); .*host memory only"):
        pb_utils.Tensor.from_dlpack("G", CudaProducer())


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def test_dlpack_in_refuses_a_raw_gpu_capsule() -> None:
    """A capsule as torch.utils.dlpack.to_dlpack(cuda_tensor) makes it: read, not consumed."""
    managed = _DLManagedTensor()
    managed.dl_tensor.device = _DLDevice(2, 0)  # kDLCUDA
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.addressof(managed), b"dltensor", None)
    with pytest.raises(E, match=r"DLPack tensor is in CUDA memory \(device 0\)"):
        pb_utils.Tensor.from_dlpack("G", capsule)
    assert type(capsule).__name__ == "PyCapsule"
