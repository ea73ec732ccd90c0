"""A custom backend's shared library through ctypes: naiad_backend.h on the Python side.

`load` opens the library and checks its ABI version and symbols; `Library.create` makes an
instance; `Instance.execute` runs a batch of requests (numpy arrays by name) and returns, per
request, the outputs or an error message. Used by the model process (`runner/model.py`), never
by the server's own process: user code that crashes must only take its own process down.

Imports only the standard library and numpy: it runs inside model processes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ABI_VERSION = 1
HEADER = Path(__file__).with_name("naiad_backend.h")

#: V2 datatype name -> (naiad_datatype value, numpy dtype); the numeric types of ABI version 1
DATATYPES: dict[str, tuple[int, np.dtype[Any]]] = {
    name: (code, np.dtype(dtype)) for name, code, dtype in (
        ("BOOL", 1, np.bool_), ("UINT8", 2, np.uint8), ("UINT16", 3, np.uint16), ("UINT32", 4, np.uint32),
        ("UINT64", 5, np.uint64), ("INT8", 6, np.int8), ("INT16", 7, np.int16), ("INT32", 8, np.int32),
        ("INT64", 9, np.int64), ("FP16", 10, np.float16), ("FP32", 11, np.float32), ("FP64", 12, np.float64),
    )
}
_BY_CODE = {code: (name, dtype) for name, (code, dtype) in DATATYPES.items()}
_SYMBOLS = ("naiad_backend_abi_version", "naiad_backend_create", "naiad_backend_execute",
            "naiad_backend_destroy", "naiad_backend_free")


class LibraryError(Exception):
    """The library cannot be used (load, symbols, version) or create() failed: the load fails."""


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("datatype", ctypes.c_int32), ("dims_count", ctypes.c_uint32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("byte_size", ctypes.c_uint64)]


class _Request(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char_p), ("parameters", ctypes.c_char_p), ("input_count", ctypes.c_uint32),
                ("inputs", ctypes.POINTER(_Tensor)), ("output_count", ctypes.c_uint32),
                ("output_names", ctypes.POINTER(ctypes.c_char_p))]


_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_int32,
                             ctypes.c_uint32, ctypes.POINTER(ctypes.c_int64))


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What the config allows for an output: its datatype and dims (-1: any), batch dim excluded."""

    datatype: str
    dims: tuple[int, ...]


@dataclass(slots=True)
class Request:
    """One request handed to the library."""

    inputs: Mapping[str, np.ndarray]  # name -> array (numeric dtype, full shape)
    outputs: Sequence[str]  # the outputs the client wants
    id: str = ""
    parameters: str = "{}"  # JSON object


def load(path: Path) -> Library:
    """Open the library at `path`; raises LibraryError saying what is wrong with it."""
    if not path.is_file():
        raise LibraryError(f"unable to find custom backend library '{path}'")
    try:
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    except OSError as error:
        raise LibraryError(f"unable to load custom backend library '{path}': {error}") from None
    missing = [name for name in _SYMBOLS if not hasattr(handle, name)]
    if missing:
        raise LibraryError(f"custom backend library '{path}' does not export {', '.join(missing)} "
                           f"(see {HEADER.name})")
    handle.naiad_backend_abi_version.restype = ctypes.c_uint32
    handle.naiad_backend_abi_version.argtypes = []
    version = handle.naiad_backend_abi_version()
    if version != ABI_VERSION:
        raise LibraryError(f"custom backend library '{path}' implements ABI version {version}; this server "
                           f"implements version {ABI_VERSION} (rebuild it against its {HEADER.name})")
    return Library(path, handle)


class Library:
    def __init__(self, path: Path, handle: ctypes.CDLL) -> None:
        self.path = path
        self._handle = handle
        handle.naiad_backend_create.restype = ctypes.c_int32
        handle.naiad_backend_create.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32,
                                                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        handle.naiad_backend_execute.restype = ctypes.c_int32
        handle.naiad_backend_execute.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Request), ctypes.c_uint32,
                                                 _ALLOCATE, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                 ctypes.POINTER(ctypes.c_void_p)]
        handle.naiad_backend_destroy.restype = None
        handle.naiad_backend_destroy.argtypes = [ctypes.c_void_p]
        handle.naiad_backend_free.restype = None
        handle.naiad_backend_free.argtypes = [ctypes.c_void_p]

    def create(self, config_json: str, version_dir: Path, index: int,
               outputs: Mapping[str, OutputSpec], batched: bool) -> Instance:
        """Create an instance; raises LibraryError with the library's message when it refuses."""
        state = ctypes.c_void_p()
        error = ctypes.c_void_p()
        code = self._handle.naiad_backend_create(config_json.encode(), str(version_dir).encode(), index,
                                                 ctypes.byref(state), ctypes.byref(error))
        if code != 0:
            message = self.take_message(error) or f"naiad_backend_create returned {code} without a message"
            raise LibraryError(message)
        return Instance(self, state, outputs, batched)

    def take_message(self, pointer: ctypes.c_void_p | int | None) -> str:
        """The library's string at `pointer` (then released through naiad_backend_free), or ''."""
        address = pointer.value if isinstance(pointer, ctypes.c_void_p) else pointer
        if not address:
            return ""
        try:
            return ctypes.string_at(address).decode(errors="replace")
        finally:
            self._handle.naiad_backend_free(address)


class _Outputs:
    """The allocator's side of one execute: checks each allocation against the config and keeps
    the arrays it hands out (the library writes into them)."""

    def __init__(self, specs: Mapping[str, OutputSpec], batched: bool, count: int) -> None:
        self.specs = specs
        self.batched = batched
        self.arrays: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
        self.errors: list[str | None] = [None] * count

    def allocate(self, context: int | None, request: int, name: bytes, datatype: int, dims_count: int,
                 shape: Any) -> int | None:
        try:  # an exception cannot cross back into C: refuse instead
            return self._allocate(request, name.decode(errors="replace"), datatype,
                                  tuple(shape[i] for i in range(dims_count)))
        except Exception as error:
            if 0 <= request < len(self.errors):
                self.errors[request] = self.errors[request] or f"output allocation failed: {error}"
            return None

    def _allocate(self, request: int, name: str, datatype: int, shape: tuple[int, ...]) -> int | None:
        if not 0 <= request < len(self.arrays):
            return None
        refusal = self._refusal(name, datatype, shape)
        if refusal is None and name in self.arrays[request]:
            refusal = f"output '{name}' was allocated twice"
        if refusal is not None:
            self.errors[request] = self.errors[request] or f"custom backend output refused: {refusal}"
            return None
        array = np.empty(shape, dtype=_BY_CODE[datatype][1])
        self.arrays[request][name] = array
        return int(array.ctypes.data)

    def _refusal(self, name: str, datatype: int, shape: tuple[int, ...]) -> str | None:
        spec = self.specs.get(name)
        if spec is None:
            return f"the model has no output '{name}'"
        if datatype not in _BY_CODE or _BY_CODE[datatype][0] != spec.datatype:
            given = _BY_CODE[datatype][0] if datatype in _BY_CODE else f"code {datatype}"
            return f"output '{name}' is {spec.datatype}, not {given}"
        expected = ((-1,) if self.batched else ()) + spec.dims
        if len(shape) != len(expected) or any(d < 0 or (e >= 0 and d != e) for d, e in zip(shape, expected,
                                                                                          strict=True)):
            return f"output '{name}' has shape {list(shape)}; the config allows {list(expected)}"
        return None


class Instance:
    """One created instance of the library (the state create made)."""

    def __init__(self, library: Library, state: ctypes.c_void_p, outputs: Mapping[str, OutputSpec],
                 batched: bool) -> None:
        self.library = library
        self._state = state
        self._specs = dict(outputs)
        self._batched = batched
        self._execute = library._handle.naiad_backend_execute

    def execute(self, requests: Sequence[Request]) -> list[dict[str, np.ndarray] | str]:
        """Run a batch: per request its outputs by name, or the message it failed with. Raises
        RuntimeError with the library's message when it failed the whole batch."""
        count = len(requests)
        keep: list[Any] = []  # everything C points into lives until the call returns
        c_requests = (_Request * count)()
        for slot, request in zip(c_requests, requests, strict=True):
            self._fill(slot, request, keep)
        outputs = _Outputs(self._specs, self._batched, count)
        allocate = _ALLOCATE(outputs.allocate)
        request_errors = (ctypes.c_void_p * count)()
        error = ctypes.c_void_p()
        code = self._execute(self._state, c_requests, count, allocate, None, request_errors, ctypes.byref(error))
        messages = [self.library.take_message(pointer) for pointer in request_errors]
        if code != 0:
            raise RuntimeError(self.library.take_message(error) or f"naiad_backend_execute returned {code}")
        self.library.take_message(error)  # a message with success: released, not shown
        results: list[dict[str, np.ndarray] | str] = []
        for index, request in enumerate(requests):
            refused, message = outputs.errors[index], messages[index]
            if refused or message:
                results.append(refused or message)
                continue
            produced = outputs.arrays[index]
            missing = [name for name in request.outputs if name not in produced]
            if missing:
                results.append(f"custom backend produced no output {', '.join(repr(m) for m in missing)}")
                continue
            results.append(produced)
        return results

    def _fill(self, slot: _Request, request: Request, keep: list[Any]) -> None:
        tensors = (_Tensor * len(request.inputs))()
        for tensor, (name, data) in zip(tensors, request.inputs.items(), strict=True):
            array = np.ascontiguousarray(data)
            entry = DATATYPES.get(_v2_name(array.dtype))
            if entry is None:
                raise ValueError(f"input '{name}' has datatype {array.dtype}, which the custom backend cannot pass")
            shape = (ctypes.c_int64 * array.ndim)(*array.shape)
            encoded = name.encode()
            keep.extend((array, shape, encoded))
            tensor.name = encoded
            tensor.datatype = entry[0]
            tensor.dims_count = array.ndim
            tensor.shape = shape
            tensor.data = array.ctypes.data
            tensor.byte_size = array.nbytes
        names = (ctypes.c_char_p * len(request.outputs))(*(n.encode() for n in request.outputs))
        encoded_id, parameters = request.id.encode(), request.parameters.encode()
        keep.extend((tensors, names, encoded_id, parameters))
        slot.id = encoded_id
        slot.parameters = parameters
        slot.input_count = len(request.inputs)
        slot.inputs = tensors
        slot.output_count = len(request.outputs)
        slot.output_names = names

    def close(self) -> None:
        if self._state is not None:
            self.library._handle.naiad_backend_destroy(self._state)
            self._state = None  # type: ignore[assignment]


def _v2_name(dtype: np.dtype[Any]) -> str:
    for name, (_, known) in DATATYPES.items():
        if known == dtype:
            return name
    return str(dtype)
