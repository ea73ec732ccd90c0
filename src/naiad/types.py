"""The data that flows through naiad: datatypes, tensors, requests and responses.

Requests flow down from frontends as `InferRequest` and come back up as `InferResponse`.
Tensors are numpy arrays; BYTES tensors are object arrays of `bytes`, BF16 tensors are
`uint16` arrays holding the raw bfloat16 bits (numpy has no bfloat16).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DataType(enum.StrEnum):
    """A tensor datatype: its V2 protocol name is the enum value (a str enum: the member is that
    string, hashed and compared as one, which keeps dict lookups by datatype cheap)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    @property
    def numpy(self) -> np.dtype[Any]:
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire; 0 for BYTES (variable length)."""
        return 0 if self is DataType.BYTES else _NUMPY[self].itemsize

    @property
    def config_name(self) -> str:
        """The model-config enum name, e.g. TYPE_FP32 (TYPE_STRING for BYTES)."""
        return "TYPE_STRING" if self is DataType.BYTES else "TYPE_" + self.value

    @classmethod
    def from_config(cls, name: str) -> DataType:
        """Map a model-config enum name (TYPE_FP32) to a DataType; ValueError if it has none."""
        if name == "TYPE_STRING":
            return cls.BYTES
        if not name.startswith("TYPE_") or name == "TYPE_INVALID":
            raise ValueError(f"unsupported data type {name}")
        return cls(name[5:])

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> DataType:
        if dtype.kind in "OSU":
            return cls.BYTES
        try:
            return _FROM_NUMPY[np.dtype(dtype)]
        except KeyError:
            raise ValueError(f"numpy dtype {dtype} has no V2 datatype") from None


_NUMPY: dict[DataType, np.dtype[Any]] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BYTES: np.dtype(object),
    DataType.BF16: np.dtype(np.uint16),
}
# uint16 maps back to UINT16, never BF16: BF16 is always tagged explicitly.
_FROM_NUMPY = {dt: t for t, dt in reversed(list(_NUMPY.items())) if t is not DataType.BYTES}
_FROM_NUMPY[np.dtype(np.uint16)] = DataType.UINT16


@dataclass(slots=True)
class Tensor:
    """A named tensor; `data` has `datatype.numpy` as dtype and `shape` as shape."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (binary_data, classification)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request, already decoded from its wire format.

    `model_version` is None when the client left the choice to the version policy.
    `outputs` is None when the client asked for every output.
    """

    model_name: str
    model_version: int | None
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    #: W3C trace context headers (traceparent, tracestate) the client sent, for OpenTelemetry
    trace_context: dict[str, str] | None = None
    #: Tracing: stamps the frontend took before the core saw the request (HTTP_RECV_*), whether
    #: the frontend ends the trace itself once the reply is sent (`trace_held`), and the trace
    #: the core started when it sampled the request.
    trace_stamps: list[tuple[str, int]] | None = None
    trace_held: bool = False
    trace: Any = None
    #: the trace of the request this one serves (an ensemble step, a BLS call): a traced
    #: parent's children are traced too, under its id
    trace_parent: Any = None


@dataclass(slots=True)
class InferResponse:
    """The answer to one request: outputs, or an error (then `outputs` is empty).

    A decoupled model answers with zero or more responses; the last one has `final` set and may
    carry no outputs at all (an "empty final response"). Other models answer exactly once.
    """

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None
    final: bool = True


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model input or output as clients see it: `shape` includes the leading -1 batch
    dimension when the model batches (max_batch_size > 0)."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    optional: bool = False
