"""What the model process's messages and pb_utils call by different names: datatypes (wire name,
numpy dtype, TRITONSERVER_DataType code), status codes, an error's text and trace ids (see stub)."""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.backends.python import pb_utils

# Wire datatype name -> numpy dtype of its arrays, and TRITONSERVER_DataType code (pb_utils values)
NUMPY_TYPES = {name: np.dtype(pb_utils.triton_string_to_numpy("TYPE_" + name)) for name in
               ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
                "FP64")}
NUMPY_TYPES["BF16"] = np.dtype(np.uint16)  # numpy has no bfloat16: the raw bits
NUMPY_TYPES["BYTES"] = np.dtype(object)  # (BYTES tensors are not viewed as one dtype: see p.tensor_array)
TYPE_CODES = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
              "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14}
TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}  # TRITONSERVER_DataType -> KServe name

# naiad Status names by pb_utils.TritonError code, and back
STATUS_BY_CODE = {
    pb_utils.TritonError.UNKNOWN: "UNKNOWN",
    pb_utils.TritonError.INTERNAL: "INTERNAL",
    pb_utils.TritonError.NOT_FOUND: "NOT_FOUND",
    pb_utils.TritonError.INVALID_ARG: "INVALID_ARG",
    pb_utils.TritonError.UNAVAILABLE: "UNAVAILABLE",
    pb_utils.TritonError.UNSUPPORTED: "UNSUPPORTED",
    pb_utils.TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    pb_utils.TritonError.CANCELLED: "CANCELLED",
}
CODE_BY_STATUS = {name: code for code, name in STATUS_BY_CODE.items()}


def describe(error: BaseException) -> str:
    """How an exception from model code reads in the response: Triton shows the message only."""
    return str(error) or type(error).__name__


_UNTRACED = pb_utils.InferenceTrace()  # what every untraced request hands its model (it has no setters)


def trace(trace_id: int) -> Any:
    """The InferenceTrace a received request hands its model: the server's trace id, if traced."""
    if not trace_id:
        return _UNTRACED
    traced = pb_utils.InferenceTrace()
    traced._handle = trace_id
    return traced


def trace_id(trace: Any) -> int:
    """The server's trace id a BLS request was given through `trace=request.trace()`, or 0."""
    handle = getattr(trace, "_handle", None)
    return handle if isinstance(handle, int) else 0
