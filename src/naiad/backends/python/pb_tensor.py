"""pb_utils' tensors and type helpers: Tensor (numpy, DLPack in and out, BYTES as object arrays)
and the TYPE_* / numpy / TRITONSERVER_DataType conversions, as upstream (see pb_utils)."""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import numpy as np

from naiad.backends.python.pb_args import as_str
from naiad.backends.python.pb_errors import TritonModelException

# -- type helpers (as upstream's triton_python_backend_utils.py) -----------------------------

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType values 1..13 (BOOL .. BYTES), upstream's two if/elif ladders as tables.
_TRITON_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_TYPE_BYTES = 13


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """`"TYPE_FP32"` -> `np.float32`; KeyError for a name outside `TRITON_STRING_TO_NUMPY`."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType value -> numpy scalar type (BYTES -> `np.object_`), None if unknown."""
    return _TRITON_TO_NUMPY.get(data_type) if isinstance(data_type, int) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or scalar type -> TRITONSERVER_DataType value, None if it has none.

    Compares with `==` like upstream, so `np.dtype("int32")` and `np.int32` both map, and an
    `np.object_` or `np.bytes_` type maps to BYTES (13)."""
    for value, numpy_type in _TRITON_TO_NUMPY.items():
        if value == _TYPE_BYTES:
            break
        if data_type == numpy_type:
            return value
    if data_type == np.object_ or data_type == np.bytes_:
        return _TYPE_BYTES
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """A BYTES tensor (object or `S` array) as Triton's wire form: each element in C order as a
    little-endian uint32 length then its bytes. None for any other dtype, as upstream.

    Object elements that are bytes go through untouched; anything else becomes `str(x)` in UTF-8.
    `S` elements lose trailing NULs (numpy strips them), which is why object arrays are preferred.
    Upstream returns `()` for an empty tensor; naiad returns `b""`, which reads the same (empty,
    falsy) and is what a byte buffer writer wants.
    """
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype == np.object_:
        parts: list[bytes] = []
        for item in input_tensor.flat:
            # Upstream tests `type(x) == bytes`, which would turn an np.bytes_ element into its
            # repr ("b'..'"); any bytes instance is taken as is here.
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    if input_tensor.dtype.type == np.bytes_:
        parts = []
        for item in input_tensor.flat:
            data = bytes(item)
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Triton's wire form of a BYTES tensor -> 1-D object array of `bytes` (reshape it yourself).

    Accepts bytes or any C-contiguous buffer (a uint8 numpy view of shared memory works); the
    elements are copies, so the buffer may be reused afterwards. A truncated buffer raises
    `struct.error`, as upstream."""
    view = memoryview(encoded_tensor).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer; its stubs do not say so
    total = len(view)
    items: list[bytes] = []
    offset = 0
    while offset < total:
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        end = offset + length
        if end > total:
            raise struct.error(f"unpack_from requires a buffer of at least {end} bytes for unpacking "
                               f"{length} bytes at offset {offset} (actual buffer size is {total})")
        items.append(view[offset:end].tobytes())
        offset = end
    array = np.empty(len(items), dtype=np.object_)
    # Assigning a list would make numpy try to broadcast equal-length bytes into a 2-D array.
    for index, item in enumerate(items):
        array[index] = item
    return array


# -- tensors ---------------------------------------------------------------------------------

# Tensor dtypes the Python backend carries, as the stub's C++ numpy_to_triton_type accepts them
# (exact `==` matches, so e.g. a big-endian int32 is refused as upstream refuses it).
_TENSOR_TYPES = (
    (np.bool_, 1), (np.uint8, 2), (np.uint16, 3), (np.uint32, 4), (np.uint64, 5), (np.int8, 6), (np.int16, 7),
    (np.int32, 8), (np.int64, 9), (np.float16, 10), (np.float32, 11), (np.float64, 12),
)

_DL_CPU = 1
_DL_CUDA_HOST = 3  # pinned host memory: numpy reads it, upstream treats it as CPU
_DL_DEVICE_NAMES = {2: "CUDA", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 13: "CUDA managed",
                    14: "oneAPI"}


_TENSOR_TYPE_CODES = {np.dtype(numpy_type): value for numpy_type, value in _TENSOR_TYPES}


def _tensor_dtype(dtype: np.dtype[Any]) -> int:
    code = _TENSOR_TYPE_CODES.get(dtype)  # dtype equality and hash include the byte order
    if code is not None:
        return code
    if dtype == np.object_ or dtype.type == np.bytes_:
        return _TYPE_BYTES
    raise TritonModelException("NumPy dtype is not supported.")


class Tensor:
    """A named tensor: `Tensor("OUTPUT0", numpy_array)`.

    Holds the array it is given without copying (the model process passes views of shared memory
    and `as_numpy()` hands them back); only a non C-contiguous array is made contiguous, as upstream.
    BYTES tensors are numpy object arrays (bytes elements; str elements are sent as UTF-8) or `S`
    arrays. Unicode (`U`) arrays are refused as upstream refuses them: use `dtype=np.object_`.
    """

    __slots__ = ("__weakref__", "_array", "_dtype", "_name")

    def __init__(self, name: str, numpy_array: Any) -> None:
        name = as_str(name, "Tensor(): name")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        dtype = _tensor_dtype(array.dtype)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._dtype = dtype

    @classmethod
    def _of(cls, name: str, array: np.ndarray, dtype: int) -> Tensor:
        """A tensor the runtime made itself (a received input): trusted, not checked."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._dtype = dtype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The array itself (not a copy)."""
        return self._array

    def shape(self) -> list[int]:
        return [int(dim) for dim in self._array.shape]

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType value (e.g. 11 for FP32, 13 for BYTES)."""
        return self._dtype

    def is_cpu(self) -> bool:
        """Always True: naiad's Python backend keeps tensors in host memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the same memory (e.g. for `torch.utils.dlpack.from_dlpack`)."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._dtype == _TYPE_BYTES:
            raise TritonModelException("DLPack does not have support for string tensors.")
        try:
            return self._array.__dlpack__(stream=stream, **kwargs)
        except BufferError as error:
            if kwargs or self._array.flags.writeable:
                raise TritonModelException(str(error)) from error
        # A read-only array has no legacy capsule (it cannot say "read-only"); DLPack 1.0 can.
        try:
            return self._array.__dlpack__(stream=stream, max_version=(1, 0))
        except (BufferError, TypeError) as error:
            raise TritonModelException(f"cannot export a read-only tensor through DLPack: {error}") from error

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A Tensor over the memory of a DLPack capsule or of any object with `__dlpack__` (torch,
        cupy, jax, numpy...). Only host memory can be taken; a GPU tensor raises."""
        name = as_str(name, "Tensor.from_dlpack(): name")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(tensor).__name__ == "PyCapsule":
            source: Any = _Capsule(tensor)
        elif hasattr(tensor, "__dlpack__"):
            source = tensor
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have a `__dlpack__` attribute")
        if hasattr(source, "__dlpack_device__"):
            device_type, device_id = source.__dlpack_device__()
            _check_host_device(int(device_type), int(device_id))
        try:
            array = np.from_dlpack(source)
        except (BufferError, TypeError, ValueError, RuntimeError) as error:
            raise TritonModelException(f"Failed to take the DLPack tensor: {error}") from error
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are "
                "supported.")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _check_host_device(device_type: int, device_id: int) -> None:
    if device_type in (_DL_CPU, _DL_CUDA_HOST):
        return
    where = _DL_DEVICE_NAMES.get(device_type, f"DLDevice type {device_type}")
    raise TritonModelException(
        f"DLPack tensor is in {where} memory (device {device_id}); naiad's Python backend keeps tensors in host "
        "memory only: move it to the CPU first (e.g. `.cpu()`)")


# Just enough of the C API to read a raw capsule's device before numpy consumes it.
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
# DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 type; int32 id}; ...};
# DLManagedTensorVersioned puts {uint32 major, minor; void* ctx; void* deleter; uint64 flags} first.
_DEVICE_OFFSET = {b"dltensor": ctypes.sizeof(ctypes.c_void_p),
                  b"dltensor_versioned": 8 + 3 * 8 + ctypes.sizeof(ctypes.c_void_p)}


class _Capsule:
    """A raw DLPack capsule dressed as a `__dlpack__` producer, which is all `np.from_dlpack` takes."""

    def __init__(self, capsule: Any) -> None:
        name = _capsule_name(capsule)
        if name not in _DEVICE_OFFSET:
            raise TritonModelException(
                f"Provided capsule is not an unconsumed DLPack tensor (capsule name {name!r}); a DLPack capsule can "
                "be taken only once")
        address = _capsule_pointer(capsule, name)
        if not address:
            raise TritonModelException("Provided DLPack capsule holds no tensor")
        offset = _DEVICE_OFFSET[name]
        self._device = (ctypes.c_int32.from_address(address + offset).value,
                        ctypes.c_int32.from_address(address + offset + 4).value)
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device
