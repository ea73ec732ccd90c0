"""The tensors a load generator sends: generated from the model's inputs, or read from a file.

As perf_analyzer: random or zero data shaped by the config (dynamic dims from `--shape`), or
perf_analyzer's `--input-data` JSON (`{"data": [{"INPUT0": [..]}, {"INPUT0": {"content": [..],
"shape": [..]}}]}`, `{"b64": ...}` for raw bytes); NumPy `.npy` (one input) and `.npz` (one array
per input name) too. Several entries are sent in turn, one per request.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from naiad.tools.loadgen.spec import ModelSpec, TensorInfo
from naiad.types import DataType

Entry = dict[str, np.ndarray]

#: Dynamic dims with no `--shape` become this (perf_analyzer refuses; a bench that just runs is kinder).
DEFAULT_DYNAMIC_DIM = 1
_INT_HIGH = 100  # random integers stay small: valid token ids, indices and class labels for most models


class DataError(ValueError):
    """The data asked for does not fit the model; the message says which input and why."""


def parse_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    """`NAME:d1,d2,...` (perf_analyzer's `--shape`) into {name: dims}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        try:
            parsed = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            parsed = ()
        if not sep or not name or not parsed or min(parsed) < 0:
            raise DataError(f"--shape expects NAME:d1,d2,... with dims >= 0, got '{value}'")
        shapes[name] = parsed
    return shapes


def input_dims(info: TensorInfo, shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The dims to send for one input (no batch dim): `--shape` where given, else the config's."""
    if info.name in shapes:
        given = shapes[info.name]
        fixed = len(given) == len(info.dims) and all(d in (-1, g) for d, g in zip(info.dims, given, strict=True))
        if not fixed:
            raise DataError(f"--shape {info.name}:{','.join(map(str, given))} does not fit the model's dims "
                            f"{list(info.dims)}")
        return given
    return tuple(DEFAULT_DYNAMIC_DIM if d < 0 else d for d in info.dims)


def generate(spec: ModelSpec, batch_size: int, shapes: dict[str, tuple[int, ...]], zero: bool = False,
             string_length: int = 128, seed: int = 0) -> list[Entry]:
    """One entry of random (or zero) tensors for every required input."""
    rng = np.random.default_rng(seed)
    unknown = set(shapes) - {i.name for i in spec.inputs}
    if unknown:
        raise DataError(f"--shape names no input of '{spec.name}': {', '.join(sorted(unknown))}")
    entry: Entry = {}
    for info in spec.inputs:
        if info.optional and info.name not in shapes:
            continue
        dims = _batched(spec, batch_size, input_dims(info, shapes))
        entry[info.name] = _values(info.datatype, dims, rng, zero, string_length)
    return [entry]


def _batched(spec: ModelSpec, batch_size: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    if spec.max_batch_size > 0:
        if batch_size > spec.max_batch_size:
            raise DataError(f"batch size {batch_size} is above '{spec.name}' max_batch_size {spec.max_batch_size}")
        return (batch_size, *dims)
    if batch_size != 1:
        raise DataError(f"'{spec.name}' does not batch (max_batch_size 0): batch size must be 1")
    return dims


def _values(datatype: DataType, dims: tuple[int, ...], rng: np.random.Generator, zero: bool,
            string_length: int) -> np.ndarray:
    if datatype is DataType.BYTES:
        count = int(np.prod(dims))
        if zero:
            return np.array([b"0"] * count, dtype=object).reshape(dims)
        letters = rng.integers(97, 123, (count, string_length), dtype=np.uint8)
        return np.array([row.tobytes() for row in letters], dtype=object).reshape(dims)
    if datatype is DataType.BF16:  # raw bfloat16 bits: the upper half of float32s
        floats = np.zeros(dims, np.float32) if zero else rng.random(dims, dtype=np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16)
    dtype = datatype.numpy
    if zero:
        return np.zeros(dims, dtype)
    if datatype is DataType.BOOL:
        return rng.integers(0, 2, dims).astype(bool)
    if np.issubdtype(dtype, np.floating):
        return rng.random(dims).astype(dtype)
    return rng.integers(0, _INT_HIGH, dims).astype(dtype)


# ---------------------------------------------------------------------------------------- files


def load_file(path: Path, spec: ModelSpec, batch_size: int) -> list[Entry]:
    """Entries from perf_analyzer's JSON, a `.npy` (the model's one required input) or a `.npz`."""
    if not path.is_file():
        raise DataError(f"input data file {path} does not exist")
    if path.suffix == ".json":
        return _json_entries(json.loads(path.read_text()), spec, batch_size)
    if path.suffix in (".npy", ".npz"):
        return [_npy_entry(path, spec, batch_size)]
    raise DataError(f"input data file {path}: expected .json (perf_analyzer's format), .npy or .npz")


def _npy_entry(path: Path, spec: ModelSpec, batch_size: int) -> Entry:
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        required = [i for i in spec.inputs if not i.optional]
        if len(required) != 1:
            raise DataError(f"{path}: one array for a model with {len(required)} inputs; use a .npz with names")
        arrays = {required[0].name: loaded}
    else:
        arrays = {name: loaded[name] for name in loaded.files}
    return {name: _fit(spec, name, array, batch_size) for name, array in arrays.items()}


def _json_entries(document: Any, spec: ModelSpec, batch_size: int) -> list[Entry]:
    rows = document.get("data") if isinstance(document, dict) else None
    if not isinstance(rows, list) or not rows:
        raise DataError('input data JSON needs {"data": [{"INPUT": ...}, ...]} with at least one entry')
    entries = []
    for row in rows:
        if isinstance(row, list):  # one stream of a sequence model: its first step
            row = row[0]
        if not isinstance(row, dict):
            raise DataError("each input data entry must be an object of input name -> values")
        entry = {}
        for name, value in row.items():
            info = _input(spec, name)
            entry[name] = _fit(spec, name, _json_array(info, value), batch_size)
        entries.append(entry)
    return entries


def _json_array(info: TensorInfo, value: Any) -> np.ndarray:
    shape = None
    if isinstance(value, dict):
        shape = value.get("shape")
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if info.datatype is DataType.BYTES:
                return np.array([raw], dtype=object)
            array = np.frombuffer(raw, info.datatype.numpy)
            return array.reshape(shape) if shape else array
        value = value.get("content")
    if info.datatype is DataType.BYTES:
        flat = [str(v).encode() if not isinstance(v, bytes) else v for v in np.ravel(np.array(value, dtype=object))]
        array = np.array(flat, dtype=object)
    else:
        array = np.asarray(value, dtype=info.datatype.numpy if info.datatype is not DataType.BF16 else np.uint16)
    if shape:
        array = array.reshape(shape)
    elif array.ndim == 1 and len(info.dims) > 1 and all(d > 0 for d in info.dims):
        array = array.reshape(info.dims)  # a flat list for a fixed multi-dimensional input
    return array


def _input(spec: ModelSpec, name: str) -> TensorInfo:
    try:
        return spec.tensor(name)
    except KeyError:
        raise DataError(f"input data names '{name}', which is not an input of '{spec.name}'") from None


def _fit(spec: ModelSpec, name: str, array: np.ndarray, batch_size: int) -> np.ndarray:
    """One sample gets the batch dim (repeated `batch_size` times) when the model batches."""
    info = _input(spec, name)
    if array.ndim != len(info.dims):
        raise DataError(f"input data for '{name}' has shape {list(array.shape)}, the model takes {list(info.dims)}")
    if spec.max_batch_size <= 0:
        return array
    return np.repeat(array[np.newaxis], batch_size, axis=0)


def bytes_payload(array: np.ndarray) -> bytes:
    """A tensor's raw bytes as the binary extension and gRPC raw contents carry them
    (BYTES elements each prefixed with its little-endian 4-byte length)."""
    if array.dtype == object:
        parts = []
        for item in array.ravel():
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(raw).to_bytes(4, "little") + raw)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()
