"""naiad's `triton_python_backend_utils`: the API Triton `model.py` files import as `pb_utils`.

The model process aliases this file as `sys.modules["triton_python_backend_utils"]`, so it must stay
importable on its own: standard library and numpy only, no relative imports, nothing from naiad.
Names, signatures, defaults and error messages follow Triton's python_backend (the Python half in
`triton_python_backend_utils.py`, the C++ half bound by `pb_stub.cc`); where naiad differs the
comment at that spot says why.

Everything that needs the server goes through one module-level runtime object that the model
process installs with `_set_runtime(runtime)` (see `Runtime`). Without one (unit tests, the
auto-complete process) the pure parts work, `Logger` writes to stderr as the upstream stub does
before its log channel is up, and BLS, response senders and model control raise a
`TritonModelException` that says no runtime is attached.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import enum
import itertools
import json
import os
import re
import struct
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

# -- flags and memory types ------------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    """Upstream's `PreferredMemory::MemoryType`. These are *not* the TRITONSERVER_MemoryType values
    (CPU=0, CPU_PINNED=1, GPU=2): upstream exports its own enum, GPU=0 and CPU=1, and no pinned
    type, so models comparing the constants see the same numbers here."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU
# Upstream's third value, the default of `InferenceRequest(preferred_memory=...)`; not exported.
_MEMORY_DEFAULT = 2


class PreferredMemory:
    """Where a BLS call would like its output tensors: `PreferredMemory(TRITONSERVER_MEMORY_GPU, 0)`."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        if preferred_memory_type is None or preferred_device_id is None:
            raise TypeError("PreferredMemory(): arguments must not be None")
        self._type = int(preferred_memory_type)
        self._device_id = int(preferred_device_id)

    # Upstream binds no accessors; these let the runtime read the preference of a BLS request.
    @property
    def preferred_memory_type(self) -> int:
        return self._type

    @property
    def preferred_device_id(self) -> int:
        return self._device_id

    def __repr__(self) -> str:
        return f"PreferredMemory({self._type}, {self._device_id})"


class InferenceTrace:
    """The trace a request carries; pass `request.trace()` to a BLS `InferenceRequest` so the child
    request joins the same trace. Models cannot build one with content, as upstream."""

    def __init__(self) -> None:
        self._context: str | None = None
        self._handle: object = None  # the runtime's own reference to the server-side trace

    def get_context(self) -> str | None:
        """The trace context (JSON text, e.g. OpenTelemetry propagation headers), or None."""
        return self._context or None


# -- errors ----------------------------------------------------------------------------------


class _ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code, in tritonserver.h order."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error to put in an `InferenceResponse`: `TritonError("bad input", TritonError.INVALID_ARG)`."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        if not isinstance(message, str):
            raise TypeError(f"TritonError(): message must be str, got {type(message)}")
        try:
            self._code = _ErrorCode(code)
        except (ValueError, TypeError):
            raise TypeError(f"TritonError(): code must be one of the TritonError codes, got {code!r}") from None
        self._message = message

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    # Upstream prints the bare object; the message is what anyone printing an error wants.
    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


class TritonModelException(Exception):
    """Raised by pb_utils on misuse, and by models from initialize/execute/finalize to fail them."""

    def message(self) -> str:
        return str(self)


# -- the runtime hook ------------------------------------------------------------------------


class Runtime(Protocol):
    """What the model process provides to this module through `_set_runtime()`.

    `handle` is the opaque object the stub gave `InferenceRequest._received()`. Errors the runtime
    raises from `load_model` / `unload_model` / `is_model_ready` should carry the server's message
    alone: pb_utils adds upstream's "Failed to load model: " style prefix. `exec` should raise
    `TritonModelException("BLS is only supported during the 'execute' function.")` outside
    `execute`, as upstream does.

    Optionally the runtime may also define `metric(event: dict) -> None` to mirror custom metrics
    on the server's /metrics endpoint (see `MetricFamily`); values are kept here either way.
    """

    def send(self, handle: object, response: InferenceResponse | None, flags: int) -> None:
        """Deliver one response (None: flags only) for the received request `handle`."""

    def is_cancelled(self, handle: object) -> bool:
        """Whether the client cancelled the received request `handle`."""

    def exec(self, request: InferenceRequest, decoupled: bool) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run a BLS request; for decoupled=True an iterator of responses with a `cancel()` method."""

    async def async_exec(
        self, request: InferenceRequest, decoupled: bool
    ) -> InferenceResponse | Iterator[InferenceResponse]:
        """`exec` for `async def execute` models."""

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        """Write a model log line to the server log; `level` is a `Logger.LogLevel` value."""

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        """Load (or reload) a model; explicit model-control mode only."""

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        """Unload a model."""

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        """Readiness of a model version ("" for the server's choice of version)."""


_runtime: Runtime | None = None


def _set_runtime(runtime: Runtime | None) -> None:
    """Attach (or, with None, detach) the model process's runtime."""
    global _runtime
    _runtime = runtime


def _get_runtime() -> Runtime | None:
    return _runtime


_NO_RUNTIME = "no naiad runtime is attached to this process"


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
    view = memoryview(encoded_tensor).cast("B")
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


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor called `name`, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor called `name`, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The `input` entry of a model config dict called `name`, or None."""
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The `output` entry of a model config dict called `name`, or None."""
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the model config dict sets `model_transaction_policy { decoupled: true }`."""
    policy = model_config.get("model_transaction_policy")
    # Upstream indexes ["decoupled"] directly; a policy without the key means the proto default.
    return bool(policy.get("decoupled", False)) if policy else False


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


def _tensor_dtype(dtype: np.dtype[Any]) -> int:
    for numpy_type, value in _TENSOR_TYPES:
        if dtype == numpy_type:
            return value
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
        if not isinstance(name, str):
            raise TypeError(f"Tensor(): name must be str, got {type(name)}")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        dtype = _tensor_dtype(array.dtype)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._dtype = dtype

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
        if not isinstance(name, str):
            raise TypeError(f"Tensor.from_dlpack(): name must be str, got {type(name)}")
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


# -- parameters ------------------------------------------------------------------------------


def _parameters_json(parameters: Any) -> str:
    """Upstream's PyParametersToJSON: a dict of str -> bool/int/str (or None) as JSON text."""
    if parameters is None:
        parameters = {}
    # Upstream takes a dict only (a JSON string is refused too); its message names the C++ type.
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return json.dumps(parameters)


# -- responses -------------------------------------------------------------------------------


class InferenceResponse:
    """One response: `InferenceResponse(output_tensors=[...], error=None, parameters={"k": 1})`.

    With an error the output tensors are ignored. `parameters()` is the JSON text of the dict."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        tensors = _tensor_list(output_tensors, "output_tensors")
        if any(tensor is None for tensor in tensors):
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse(): error must be a TritonError or None, got {type(error)}")
        self._output_tensors: list[Tensor] = [tensor for tensor in tensors if tensor is not None]
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return list(self._output_tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def _prune(self, requested: Iterable[str]) -> None:
        """Keep only the requested outputs, as upstream's sender does before sending."""
        wanted = set(requested)
        self._output_tensors = [tensor for tensor in self._output_tensors if tensor.name() in wanted]


def _tensor_list(values: Any, argument: str) -> list[Tensor | None]:
    if values is None:
        return []
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{argument} must be a list of pb_utils.Tensor, got {type(values)}")
    items = list(values)
    for item in items:
        if item is not None and not isinstance(item, Tensor):
            raise TypeError(f"{argument} must be a list of pb_utils.Tensor, found an element of type {type(item)}")
    return items


# -- requests and response senders -----------------------------------------------------------


class InferenceResponseSender:
    """Sends the responses of one received request (`request.get_response_sender()`), from any
    thread, also after `execute` returned. Decoupled models send any number of responses then
    `flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`; other models exactly one response and the final
    flag (with it or after it)."""

    def __init__(self, handle: object, decoupled: bool | None, requested_output_names: Iterable[str]) -> None:
        self._handle = handle
        self._decoupled = decoupled
        self._requested = frozenset(requested_output_names)
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send(): response must be an InferenceResponse or None, got {type(response)}")
        if self._handle is None:
            # A request the model built for BLS has no client to answer.
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the decoupled state of the model.")
        runtime = _runtime
        if runtime is None:
            raise TritonModelException(f"Unable to send response. {_NO_RUNTIME}.")
        with self._lock:
            # The stub may not say whether the model is decoupled (None); the server then checks.
            if self._decoupled is False:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response.")
                if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                        "response.")
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1
        # An empty set means the stub did not pass the effective outputs: send everything.
        if response is not None and self._requested:
            response._prune(self._requested)
        try:
            runtime.send(self._handle, response, flags)
        except TritonModelException:
            raise
        except Exception as error:
            raise TritonModelException(str(error)) from error

    def is_cancelled(self) -> bool:
        return _is_cancelled(self._handle)

    # For the stub: whether the model finished this request through the sender, and closing it
    # when the stub answers the request itself (e.g. execute raised).
    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _responses_sent(self) -> int:
        with self._lock:
            return self._sent

    def _close(self) -> None:
        with self._lock:
            self._closed = True


def _is_cancelled(handle: object) -> bool:
    runtime = _runtime
    if handle is None or runtime is None:
        return False  # a BLS request the model built, or no server to ask
    return bool(runtime.is_cancelled(handle))


_UNSET: Any = object()


class InferenceRequest:
    """A request: received by `execute`, or built by the model for BLS.

    BLS: `InferenceRequest(model_name="m", inputs=[...], requested_output_names=["OUT"])` then
    `.exec()` (or `await .async_exec()`), with `decoupled=True` for an iterator of responses.

    For the model process: `_received()` builds a received request; `_handle`, `_release_flags`,
    `_sender` (None until `get_response_sender()`), `_preferred_memory` and `_trace` are what the
    stub reads back.
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = _UNSET,
        requested_output_names: Sequence[str] = _UNSET,
        model_name: str = _UNSET,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = _UNSET,
        trace: InferenceTrace | None = _UNSET,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        # inputs, requested_output_names and model_name are required, as upstream (TypeError).
        for argument, value in (("inputs", inputs), ("requested_output_names", requested_output_names),
                                ("model_name", model_name)):
            if value is _UNSET:
                raise TypeError(f"InferenceRequest(): missing required argument '{argument}'")
        if not isinstance(request_id, str):
            raise TypeError(f"InferenceRequest(): request_id must be str, got {type(request_id)}")
        if not isinstance(model_name, str):
            raise TypeError(f"InferenceRequest(): model_name must be str, got {type(model_name)}")
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(correlation_id, int) and not 0 <= correlation_id < 2**64:
            raise TritonModelException("Correlation ID must be an unsigned 64-bit integer or a string")
        _check_uint("model_version", model_version, signed=True)
        _check_uint("flags", flags, bits=32)
        _check_uint("timeout", timeout)
        tensors = _tensor_list(inputs, "inputs")
        if any(tensor is None for tensor in tensors):
            raise TritonModelException(
                f"Input tensor for request with id '{request_id}' and model name '{model_name}' should not be empty.")
        if isinstance(requested_output_names, str | bytes) or not isinstance(requested_output_names, Iterable):
            raise TypeError("InferenceRequest(): requested_output_names must be a list of str")
        names = list(requested_output_names)
        for output in names:
            if not isinstance(output, str):
                raise TypeError("InferenceRequest(): requested_output_names must be a list of str")
            if output == "":
                raise TritonModelException(
                    f"Requested output name for request with id '{request_id}' and model name '{model_name}' "
                    "should not be empty.")
        if preferred_memory is _UNSET:
            preferred_memory = PreferredMemory(_MEMORY_DEFAULT, 0)
        elif not isinstance(preferred_memory, PreferredMemory):
            raise TypeError("InferenceRequest(): preferred_memory must be a pb_utils.PreferredMemory")
        if trace is _UNSET:
            trace = InferenceTrace()
        elif not isinstance(trace, InferenceTrace):
            raise TypeError("InferenceRequest(): trace must be the InferenceTrace of a request (request.trace())")
        self._setup(
            inputs=tensors, request_id=request_id, correlation_id=correlation_id, flags=flags, timeout=timeout,
            parameters=_parameters_json(parameters), requested_output_names=names, model_name=model_name,
            model_version=model_version, handle=None, decoupled=None, trace=trace,
            preferred_memory=preferred_memory)

    @classmethod
    def _received(
        cls,
        *,
        inputs: list[Tensor],
        request_id: str,
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters: str,
        requested_output_names: list[str],
        model_name: str,
        model_version: int,
        handle: object,
        decoupled: bool | None = None,
        trace: InferenceTrace | None = None,
    ) -> InferenceRequest:
        """A request the server sent to this model (built by the stub; trusted, not validated).

        `decoupled` lets the response sender apply upstream's one-response rule for non-decoupled
        models; None leaves that check to the server. `parameters` is the request's JSON text."""
        request = cls.__new__(cls)
        request._setup(
            inputs=list(inputs), request_id=request_id, correlation_id=correlation_id, flags=flags,
            timeout=timeout, parameters=parameters or "{}", requested_output_names=list(requested_output_names),
            model_name=model_name, model_version=model_version, handle=handle, decoupled=decoupled,
            trace=trace if trace is not None else InferenceTrace(),
            preferred_memory=PreferredMemory(_MEMORY_DEFAULT, 0))
        return request

    def _setup(
        self, *, inputs: list[Any], request_id: str, correlation_id: int | str, flags: int, timeout: int,
        parameters: str, requested_output_names: list[str], model_name: str, model_version: int, handle: object,
        decoupled: bool | None, trace: InferenceTrace, preferred_memory: PreferredMemory,
    ) -> None:
        self._inputs: list[Tensor] = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters
        # Upstream keeps the names in a std::set, which Python sees as a set; order kept here.
        self._requested_output_names = list(dict.fromkeys(requested_output_names))
        self._model_name = model_name
        self._model_version = model_version
        self._handle = handle
        self._decoupled = decoupled
        self._trace = trace
        self._preferred_memory = preferred_memory
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._sender: InferenceResponseSender | None = None
        self._sender_lock = threading.Lock()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        _check_uint("flags", flags, bits=32)
        self._flags = flags

    def timeout(self) -> int:
        """Timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as JSON text: `json.loads(request.parameters())`."""
        return self._parameters

    def requested_output_names(self) -> set[str]:
        return set(self._requested_output_names)

    # Upstream binds neither; naiad's stub reads them to route BLS requests.
    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        """This request's sender; the same object on every call."""
        with self._sender_lock:
            if self._sender is None:
                self._sender = InferenceResponseSender(self._handle, self._decoupled, self._requested_output_names)
            return self._sender

    def is_cancelled(self) -> bool:
        return _is_cancelled(self._handle)

    def set_release_flags(self, flags: int) -> None:
        """`TRITONSERVER_REQUEST_RELEASE_RESCHEDULE` hands the request back for another execute
        (iterative sequence batching); the default is `TRITONSERVER_REQUEST_RELEASE_ALL`."""
        if flags is None or isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"set_release_flags(): flags must be int, got {type(flags)}")
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on `model_name` and wait: the response, or with `decoupled=True` an
        iterator over the responses that also has `cancel()`."""
        runtime = _runtime
        if runtime is None:
            raise TritonModelException(f"BLS is only supported during the 'execute' function ({_NO_RUNTIME}).")
        return runtime.exec(self, bool(decoupled))

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """`exec` for `async def execute`: `await request.async_exec()` (or gather several)."""
        runtime = _runtime
        if runtime is None:
            raise TritonModelException(f"BLS is only supported during the 'execute' function ({_NO_RUNTIME}).")
        return await runtime.async_exec(self, bool(decoupled))

    def __repr__(self) -> str:
        return (f"InferenceRequest(request_id={self._request_id!r}, model_name={self._model_name!r}, "
                f"inputs={[tensor.name() for tensor in self._inputs]})")


def _check_uint(argument: str, value: Any, *, bits: int = 64, signed: bool = False) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"InferenceRequest(): {argument} must be int, got {type(value)}")
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2**bits)
    if not low <= value < high:
        kind = "a signed" if signed else "an unsigned"
        raise TypeError(f"InferenceRequest(): {argument} must be {kind} {bits}-bit integer, got {value}")


# -- model control ---------------------------------------------------------------------------


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload `model_name` (explicit model-control mode). `config` is a JSON model config
    overriding the repository's; `files` maps "file:<path in the version dir>" to file contents and
    needs `config`."""
    if not isinstance(model_name, str):
        raise TypeError(f"load_model(): model_name must be str, got {type(model_name)}")
    if not isinstance(config, str):
        raise TypeError(f"load_model(): config must be str, got {type(config)}")
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents")
        for path, content in files.items():
            if not isinstance(path, str) or not isinstance(content, bytes):
                raise TypeError("load_model(): files must map str paths to bytes contents")
    runtime = _runtime
    if runtime is None:
        raise TritonModelException(f"Failed to load model: {_NO_RUNTIME}")
    try:
        runtime.load_model(model_name, config, dict(files) if files is not None else None)
    except Exception as error:
        raise TritonModelException(f"Failed to load model: {error}") from error


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload `model_name` (and, with `unload_dependents`, the models that depend on it)."""
    if not isinstance(model_name, str):
        raise TypeError(f"unload_model(): model_name must be str, got {type(model_name)}")
    runtime = _runtime
    if runtime is None:
        raise TritonModelException(f"Failed to unload model: {_NO_RUNTIME}")
    try:
        runtime.unload_model(model_name, bool(unload_dependents))
    except Exception as error:
        raise TritonModelException(f"Failed to unload model: {error}") from error


# std::stol reads an optional sign and digits after leading blanks and ignores what follows.
_STOL = re.compile(r"\s*([+-]?\d+)")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether `model_name` (version `model_version`, "" for the server's choice) is ready."""
    if not isinstance(model_name, str):
        raise TypeError(f"is_model_ready(): model_name must be str, got {type(model_name)}")
    if not isinstance(model_version, str):
        raise TypeError(f"is_model_ready(): model_version must be str, got {type(model_version)}")
    if model_version:
        # Checked here (upstream checks in the server process) with upstream's messages.
        match = _STOL.match(model_version)
        if match is None:
            raise TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}' (details: stol), version should be an integral value > 0")
        if int(match.group(1)) < 0:
            raise TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}', version should be an integral value > 0")
        model_version = str(int(match.group(1)))  # what the server would read from it
    runtime = _runtime
    if runtime is None:
        raise TritonModelException(f"Failed to check model readiness: {_NO_RUNTIME}")
    try:
        return bool(runtime.is_model_ready(model_name, model_version))
    except Exception as error:
        raise TritonModelException(f"Failed to check model readiness: {error}") from error


# -- logging ---------------------------------------------------------------------------------


class _LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Model logging into the server log: `pb_utils.Logger.log_info("...")`, or
    `Logger.log("...", Logger.WARNING)`. Each line carries the caller's file and line."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = _LogLevel.INFO) -> None:
        _emit(message, level, sys._getframe(1))

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, _LogLevel.INFO, sys._getframe(1))

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, _LogLevel.WARNING, sys._getframe(1))

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, _LogLevel.ERROR, sys._getframe(1))

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, _LogLevel.VERBOSE, sys._getframe(1))


_LEADING_CHAR = {_LogLevel.INFO: "I", _LogLevel.WARNING: "W", _LogLevel.ERROR: "E", _LogLevel.VERBOSE: "I"}


def _emit(message: Any, level: Any, frame: Any) -> None:
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    if not isinstance(message, str):
        raise TypeError(f"Logger: message must be str, got {type(message)}")
    try:
        log_level = _LogLevel(level)
    except (ValueError, TypeError):
        raise TypeError(f"Logger: level must be a Logger.LogLevel, got {level!r}") from None
    # The frame of whoever called Logger.*, as upstream reads it with inspect.currentframe().
    filename, line = frame.f_code.co_filename, int(frame.f_lineno)
    runtime = _runtime
    if runtime is not None:
        runtime.log(int(log_level), message, filename, line)
        return
    # Upstream's format before the stub's log channel is up: glog-like prefix, then two blanks.
    now = datetime.datetime.now(datetime.UTC)
    prefix = (f"{_LEADING_CHAR[log_level]}{now:%m%d %H:%M:%S}.{now.microsecond:06d} {os.getpid()} "
              f"{os.path.basename(filename)}:{line}]")
    print(f"{prefix}  {message}", file=sys.stderr, flush=True)


# -- auto-complete config --------------------------------------------------------------------


class ModelConfig:
    """The model configuration handed to `auto_complete_config`. Built from the config's JSON text
    (as upstream) or from its dict; `as_dict()` is the live dict the setters edit."""

    def __init__(self, model_config: str | bytes | dict[str, Any]) -> None:
        if isinstance(model_config, dict):
            # A round trip gives the model its own copy, as upstream's json.loads does.
            self._model_config: dict[str, Any] = json.loads(json.dumps(model_config))
        else:
            self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; a configuration value above the new one is an error."""
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for model "
                f"'{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher, unless another scheduler is configured (an error)."""
        found = next((key for key in ("sequence_batching", "ensemble_scheduling") if key in self._model_config),
                     None)
        if found is not None:
            raise ValueError(
                f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for "
                f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # upstream's parameter name, shadowing and all
        """Add an input {name, data_type, dims[, optional]}; an existing one must agree with it."""
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"),
                         "'name', 'data_type', 'dims' and 'optional'")

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output {name, data_type, dims}; an existing one must agree with it."""
        self._add_tensor("output", output, ("name", "data_type", "dims"), "'name', 'data_type' and 'dims'")

    def _add_tensor(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...], valid_text: str) -> None:
        model = self._name()
        where = f"in auto-complete-config function for model '{model}'"
        for key in tensor:
            # Upstream names the tensor here even when 'name' is missing (a KeyError there).
            if key not in valid and "name" in tensor:
                raise ValueError(f"{kind} '{tensor['name']}' {where} contains property other than {valid_text}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{tensor['name']}' {where} is missing '{key}' property.")
        name = tensor["name"]
        for current in self._model_config.setdefault(kind, []):
            if current["name"] != name:
                continue
            data_type = current.get("data_type", "TYPE_INVALID")
            if data_type != "TYPE_INVALID" and data_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {data_type} for {kind} "
                    f"'{name}', model provides {tensor['data_type']}")
            dims = current.get("dims")
            if dims and dims != tensor["dims"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {tensor['dims']} but the model "
                    f"configuration specifies dims {dims}")
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} but the "
                    f"model configuration specifies optional {current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set model_transaction_policy ({"decoupled": True}); changing a configured value is an error."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name()}' "
                    "contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name()}', "
                    f"which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted


# -- custom metrics --------------------------------------------------------------------------


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_TEXT = {MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
              MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
              MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


class _FamilyState:
    """One metric family of the process, shared by every MetricFamily object of that name (the
    server's registry does the same: a second family of the same name is the first one)."""

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[str, _SeriesState] = {}  # by labels JSON


class _SeriesState:
    """One labelled series: the value (counter, gauge) or the histogram's buckets, count and sum.
    Every Metric object with the same labels shares it, as the server's metrics do."""

    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = labels
        self.value = 0.0
        self.buckets = buckets
        self.bucket_counts = [0] * (len(buckets) + 1) if buckets is not None else []  # the last one is +Inf
        self.count = 0
        self.sum = 0.0
        self.references = 0


_metrics_lock = threading.RLock()
_families: dict[str, _FamilyState] = {}


class MetricFamily:
    """A custom metric family: `MetricFamily(name, description, MetricFamily.COUNTER)`; then
    `.Metric(labels={...})` (histograms: `buckets=[...]`) for each labelled series.

    Values are kept in this process (`value()` answers from here). When the runtime defines
    `metric(event)`, every change is also passed on as a dict: {"op": "update" | "delete",
    "family", "description", "kind" ("counter" | "gauge" | "histogram"), "labels", "value",
    "buckets", "bucket_counts" (cumulative, one per bucket then +Inf), "count", "sum"}.
    A MetricFamily must outlive its Metric objects: deleting it first disables them, as upstream.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        try:
            metric_kind = MetricKind(kind)
        except (ValueError, TypeError):
            raise TypeError(f"MetricFamily(): kind must be a MetricFamily kind, got {kind!r}") from None
        if not name:
            raise TritonModelException("Error when creating MetricFamily: metric family name must not be empty")
        with _metrics_lock:
            state = _families.get(name)
            if state is None:
                state = _families[name] = _FamilyState(name, description, metric_kind)
            elif state.kind != metric_kind:
                raise TritonModelException(
                    f"Error when creating MetricFamily: a metric family named '{name}' already exists with kind "
                    f"{state.kind.name}")
        self._state = state
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()

    # Upstream's name for the method, capitalised as it is.
    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        kind = self._state.kind
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [float(bound) for bound in buckets]
            if any(upper <= lower for lower, upper in itertools.pairwise(bounds)):
                raise TritonModelException(
                    "Error when creating Metric: histogram bucket boundaries must be in strictly increasing order")
        elif kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        else:
            bounds = None
        label_map = dict(labels or {})
        for key, value in label_map.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("Error when creating Metric: label keys and values must be strings")
        metric = Metric._attach(self._state, label_map, bounds)
        self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        # Upstream clears the metrics made through this object when it goes away. Errors are
        # dropped: __del__ may run at interpreter shutdown, with nobody to report them to.
        with contextlib.suppress(Exception):
            for metric in list(self._metrics):
                metric._clear()


class Metric:
    """One labelled series of a MetricFamily: `increment(v)`, `set(v)` (gauges), `observe(v)`
    (histograms), `value()` (counters and gauges)."""

    def __init__(self) -> None:
        raise TypeError("Metric objects are made by MetricFamily.Metric(labels=..., buckets=...)")

    @classmethod
    def _attach(cls, family: _FamilyState, labels: dict[str, str], buckets: list[float] | None) -> Metric:
        key = json.dumps(labels, sort_keys=True)
        with _metrics_lock:
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _SeriesState(labels, buckets)
                created = True
            else:
                created = False
            series.references += 1
        metric = cls.__new__(cls)
        metric._family = family
        metric._key = key
        metric._series = series
        metric._cleared = False
        if created:
            _publish("update", family, series, "Error when creating Metric: ")
        return metric

    def _check(self, what: str) -> None:
        if self._cleared:
            raise TritonModelException(
                f"{what}Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted.")

    def increment(self, value: float) -> None:
        what = "Failed to increment metric value: "
        self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Increment")
        if kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                f"{what}TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                "values.")
        with _metrics_lock:
            self._series.value += float(value)
        _publish("update", self._family, self._series, what)

    def set(self, value: float) -> None:
        what = "Failed to set metric value: "
        self._check(what)
        kind = self._family.kind
        if kind != MetricKind.GAUGE:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Set")
        with _metrics_lock:
            self._series.value = float(value)
        _publish("update", self._family, self._series, what)

    def observe(self, value: float) -> None:
        what = "Failed to observe metric value: "
        self._check(what)
        kind = self._family.kind
        if kind != MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Observe")
        sample = float(value)
        series = self._series
        with _metrics_lock:
            assert series.buckets is not None
            index = next((i for i, bound in enumerate(series.buckets) if sample <= bound), len(series.buckets))
            series.bucket_counts[index] += 1
            series.count += 1
            series.sum += sample
        _publish("update", self._family, series, what)

    def value(self) -> float:
        what = "Failed to get metric value: "
        self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Value")
        with _metrics_lock:
            return self._series.value

    def _clear(self) -> None:
        """Drop this object's hold on its series (the last one removes the series)."""
        with _metrics_lock:
            if self._cleared:
                return
            self._cleared = True
            self._series.references -= 1
            gone = self._series.references == 0
            if gone:
                self._family.series.pop(self._key, None)
        if gone:
            try:
                _publish("delete", self._family, self._series, "Error when deleting Metric: ")
            except TritonModelException as error:
                print(error, file=sys.stderr)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # see MetricFamily.__del__
            self._clear()


def _publish(op: str, family: _FamilyState, series: _SeriesState, what: str) -> None:
    hook = getattr(_runtime, "metric", None)
    if hook is None:
        return
    with _metrics_lock:
        cumulative, running = [], 0
        for count in series.bucket_counts:
            running += count
            cumulative.append(running)
        event = {
            "op": op, "family": family.name, "description": family.description, "kind": family.kind.name.lower(),
            "labels": dict(series.labels), "value": series.value,
            "buckets": list(series.buckets) if series.buckets is not None else None,
            "bucket_counts": cumulative, "count": series.count, "sum": series.sum,
        }
    try:
        hook(event)
    except Exception as error:
        raise TritonModelException(f"{what}{error}") from error
