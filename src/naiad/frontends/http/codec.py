"""KServe V2 HTTP inference codec: JSON bodies plus Triton's binary tensor extension.

Pure functions, no server. Error texts follow Triton's http_server.cc / core where known, so
clients that match on them keep working; every decode error is an InvalidArgument (400),
except a shape dim or a shared-memory parameter of the wrong JSON type, which Triton answers
with 500. Inputs in shared memory decode to empty placeholders that
`frontends.shared_memory.resolve_inputs` fills.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any, NamedTuple

import msgspec
import numpy as np

from naiad.errors import InvalidArgument, Status
from naiad.frontends.tensors import (
    INT64_MAX,
    bf16_to_float32,
    byte_size,
    check_empty_shape,
    element_count,
    float_to_bf16_bits,
    tensor_from_raw,
    tensor_to_raw,
)
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec

_MISSING: Any = object()
_DATATYPES = {dt.value: dt for dt in DataType}
# Bytes per element for the overflow check (1 for BYTES: only its element count can overflow).
_ITEMSIZE = {dt.value: dt.itemsize or 1 for dt in DataType}
_BYTES = DataType.BYTES
_BF16 = DataType.BF16
_FP16 = DataType.FP16
_INT64 = (-(2**63), 2**63 - 1)
_FLOATS = frozenset({DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16})
_INTS = frozenset(
    {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64}
    | {DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64}
)
_NOT_ARRAY = "attempt to access JSON non-array as array"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_NUMBER = "attempt to access JSON non-number as double"
_SHM_REGION = "shared_memory_region"
_SHM_OFFSET = "shared_memory_offset"
_SHM_BYTE_SIZE = "shared_memory_byte_size"


def _enc_hook(obj: Any) -> Any:
    # Backends and parameters may hand us numpy scalars/arrays; only called for those.
    if isinstance(obj, np.generic | np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} as JSON")


_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


class _InputHead(NamedTuple):
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    elements: int
    parameters: dict[str, Any]


class _Body:
    """The request body and how far its binary section has been consumed."""

    __slots__ = ("framed", "model_name", "offset", "view")

    def __init__(self, view: memoryview, offset: int, framed: bool, model_name: str) -> None:
        self.view = view
        self.offset = offset
        self.framed = framed
        self.model_name = model_name


# ---------------------------------------------------------------------------------------- decode


def decode_infer_request(
    body: bytes, header_length: int | None, model_name: str, model_version: int | None
) -> InferRequest:
    """Decode a V2 infer request: JSON, optionally followed by binary tensor data.

    `header_length` is the Inference-Header-Content-Length value, None when absent (the whole
    body is JSON). A value of 0 means a raw binary request: use `decode_raw_request` for it.
    """
    view = memoryview(body).cast("B")
    json_end = _header_end(len(view), header_length)
    header = _parse_json(view[:json_end])
    request_id = _request_id(header)
    parameters = _request_parameters(header)
    inputs = _decode_inputs(header, _Body(view, json_end, header_length is not None, model_name))
    outputs = _decode_outputs(header)
    return InferRequest(model_name, model_version, inputs, outputs, request_id, parameters)


def _header_end(body_length: int, header_length: int | None) -> int:
    if header_length is None:
        return body_length
    if header_length < 0 or header_length > body_length:
        raise InvalidArgument(f"inference header size should be in range (0, {body_length}), got: {header_length}")
    return header_length


def _parse_json(buffer: memoryview) -> dict[str, Any]:
    try:
        document = _decoder.decode(buffer)
    except msgspec.DecodeError as error:
        document = _parse_json_slow(buffer, error)
    except RecursionError:
        raise InvalidArgument(
            "failed to parse the request JSON buffer: JSON nesting depth exceeds maximum allowed limit"
        ) from None
    # Like Triton, a non-object document fails later as "no 'inputs' member".
    return document if isinstance(document, dict) else {}


def _parse_json_slow(buffer: memoryview, error: msgspec.DecodeError) -> Any:
    """Retry with the stdlib parser, which (like Triton's rapidjson) accepts NaN and Infinity."""
    try:
        return json.loads(bytes(buffer))
    except (ValueError, RecursionError):
        raise InvalidArgument(f"failed to parse the request JSON buffer: {error}") from None


def _request_id(header: dict[str, Any]) -> str:
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"Unable to parse 'id': {_NOT_STRING}")
    return request_id


def _request_parameters(header: dict[str, Any]) -> dict[str, Any]:
    parameters = header.get("parameters", _MISSING)
    if parameters is _MISSING:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidArgument("failed to get request params.: attempt to get members for non-object")
    for key, value in parameters.items():
        _check_request_parameter(key, value)
    return parameters


def _check_request_parameter(key: str, value: Any) -> None:
    if key == "sequence_id":
        if not (_is_uint(value) or isinstance(value, str)):
            raise InvalidArgument(f"Unable to parse 'sequence_id': {_NOT_STRING}")
    elif key in ("sequence_start", "sequence_end", "binary_data_output"):
        if not isinstance(value, bool):
            raise InvalidArgument(f"Unable to parse '{key}': {_NOT_BOOL}")
    elif key in ("priority", "timeout"):
        if not _is_uint(value):
            raise InvalidArgument(f"Unable to parse '{key}': {_NOT_UINT}")
    elif key.startswith("triton_"):
        raise InvalidArgument(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
        )
    elif not isinstance(value, str | int | float) or (type(value) is int and not _INT64[0] <= value <= _INT64[1]):
        # Triton takes strings, bools, int64 and doubles; not null, arrays or objects.
        raise InvalidArgument(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _decode_inputs(header: dict[str, Any], body: _Body) -> list[Tensor]:
    items = header.get("inputs", _MISSING)
    if items is _MISSING:
        raise InvalidArgument("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")
    if not isinstance(items, list):
        raise InvalidArgument(f"Unable to parse 'inputs': {_NOT_ARRAY}")
    tensors: list[Tensor] = []
    seen: set[str] = set()
    for item in items:
        head = _input_head(item if isinstance(item, dict) else {}, body.model_name)
        if head.name in seen:
            raise InvalidArgument(f"input '{head.name}' already exists in request")
        seen.add(head.name)
        data = _input_data(head, item, body)
        tensors.append(Tensor(head.name, head.datatype, head.shape, data, head.parameters))
    if body.offset != len(body.view):
        raise InvalidArgument(f"unexpected additional input data for model '{body.model_name}'")
    return tensors


def _input_head(item: dict[str, Any], model_name: str) -> _InputHead:
    parameters = item.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    if ("data" in item) + ("binary_data_size" in parameters) + ("shared_memory_region" in parameters) != 1:
        _check_content_fields(item, parameters)  # raises
    # The checks inline for the usual request; the helper says what is wrong with another.
    name = item.get("name")
    if type(name) is not str:
        name = _member_str(item, "name")
    datatype_name = item.get("datatype")
    if type(datatype_name) is not str:
        datatype_name = _member_str(item, "datatype")
    shape = item.get("shape", _MISSING)
    if shape is _MISSING:
        raise _input_error(name, "Unable to parse 'shape': attempt to access non-existing object member 'shape'")
    if not isinstance(shape, list):
        raise _input_error(name, f"Unable to parse 'shape': {_NOT_ARRAY}")
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            # Triton's JSON reader reports this as INTERNAL (SPEC §1.3: negative dims → 500).
            raise InvalidArgument(f"Unable to parse 'shape': {_NOT_UINT} for input '{name}'", Status.INTERNAL)
        count *= dim
    datatype = _DATATYPES.get(datatype_name)
    if datatype is None:
        raise InvalidArgument(f"invalid datatype for input {name}")
    if count * _ITEMSIZE[datatype_name] > INT64_MAX:
        element_count(shape, name, model_name)  # raises the element count overflow, if that is it
        byte_size(datatype, count, name, model_name)
    if count == 0:
        check_empty_shape(shape, datatype, name, model_name)
    return _InputHead(name, datatype, tuple(shape), count, parameters)


def _check_content_fields(item: dict[str, Any], parameters: dict[str, Any]) -> None:
    present = (
        "data" in item,
        "binary_data_size" in parameters,
        "shared_memory_region" in parameters,
    )
    if sum(present) == 1:
        return
    names = ("'data'", "'binary_data_size'", "'shared_memory_region'")
    fields = [name for name, found in zip(names, present, strict=True) if found]
    found = " set " + " ".join(fields) if fields else " no field is set"
    raise InvalidArgument(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But" + found
    )


def _member_str(item: dict[str, Any], member: str) -> str:
    value = item.get(member, _MISSING)
    if value is _MISSING:
        raise InvalidArgument(f"Unable to parse '{member}': attempt to access non-existing object member '{member}'")
    if not isinstance(value, str):
        raise InvalidArgument(f"Unable to parse '{member}': {_NOT_STRING}")
    return value


def _input_error(name: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{message} for input '{name}'")


def _input_data(head: _InputHead, item: dict[str, Any], body: _Body) -> np.ndarray:
    size = head.parameters.get("binary_data_size", _MISSING)
    if size is not _MISSING:
        raw = _take(head, size, body)
        return tensor_from_raw(head.name, head.datatype, head.shape, raw, body.model_name, count=head.elements)
    if _SHM_REGION in head.parameters:
        _check_shm_parameters(head.parameters)
        # A placeholder: frontends.shared_memory.resolve_inputs reads the data from the region.
        return np.empty(0, dtype=head.datatype.numpy)
    return _json_tensor(head, item["data"])


def _check_shm_parameters(parameters: dict[str, Any]) -> None:
    """Triton's HTTP frontend reads these JSON values first, and answers 500 when one has the wrong
    type; the shared-memory helpers check everything else."""
    if not isinstance(parameters[_SHM_REGION], str):
        raise InvalidArgument(f"Unable to parse '{_SHM_REGION}': {_NOT_STRING}", Status.INTERNAL)
    for key in (_SHM_OFFSET, _SHM_BYTE_SIZE):
        if key in parameters and not _is_uint(parameters[key]):
            raise InvalidArgument(f"Unable to parse '{key}': {_NOT_UINT}", Status.INTERNAL)


def _take(head: _InputHead, size: Any, body: _Body) -> memoryview:
    """The next `size` bytes of the binary section, without copying."""
    if type(size) is not int or size < 0:
        raise _input_error(head.name, f"Unable to parse 'binary_data_size': {_NOT_UINT}")
    if size == 0:
        return body.view[0:0]
    if not body.framed:
        raise InvalidArgument(
            "must specify valid 'Infer-Header-Content-Length' in request header and "
            "'binary_data_size' when passing inputs in binary data format"
        )
    start, end = body.offset, body.offset + size
    if end > len(body.view):
        raise InvalidArgument(
            f"unexpected size for input '{head.name}', expecting {end - len(body.view)} additional "
            f"bytes for model '{body.model_name}'"
        )
    body.offset = end
    return body.view[start:end]


# ------------------------------------------------------------------------------- JSON tensor data


def _json_tensor(head: _InputHead, data: Any) -> np.ndarray:
    if head.elements == 0:
        # Triton never reads 'data' for an empty tensor.
        return np.empty(head.shape, dtype=head.datatype.numpy)
    if not isinstance(data, list):
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_ARRAY}")
    decode = _json_bytes if head.datatype is _BYTES else _json_numbers
    return decode(head, data).reshape(head.shape)


def _check_count(head: _InputHead, got: int) -> None:
    if got != head.elements:
        shape = "[" + ",".join(map(str, head.shape)) + "]"
        raise InvalidArgument(
            "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
            f"'{head.name}' (shape {shape} has {head.elements} elements, 'data' has {got})"
        )


def _json_bytes(head: _InputHead, data: list[Any]) -> np.ndarray:
    try:
        items = [s.encode("utf-8", "surrogatepass") for s in data]
    except AttributeError:  # nested lists, or a non-string element
        items = [_string_bytes(head, s) for s in _flatten(data)]
    _check_count(head, len(items))
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _string_bytes(head: _InputHead, value: Any) -> bytes:
    if not isinstance(value, str):
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_STRING}")
    return value.encode("utf-8", "surrogatepass")


def _json_numbers(head: _InputHead, data: list[Any]) -> np.ndarray:
    try:
        array = np.asarray(data)
    except ValueError:  # ragged nesting, or deeper than numpy's 64 dims
        array = np.asarray(_flatten(data))
    _check_count(head, array.size)
    convert = _CONVERT[head.datatype]
    if convert is _to_int and array.dtype.kind == "f":
        # numpy turns a mix of int64-only and uint64-only integers into float64; keep them exact.
        array = np.array(_flatten(data), dtype=object)
    return convert(head, array if array.ndim == 1 else array.reshape(-1))


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major leaves of arbitrarily nested lists, without recursion."""
    leaves: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            leaves.append(item)
        else:
            stack.pop()
    return leaves


def _to_bool(head: _InputHead, array: np.ndarray) -> np.ndarray:
    if array.dtype.kind != "b":
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_BOOL}")
    return array


def _to_int(head: _InputHead, array: np.ndarray) -> np.ndarray:
    target = head.datatype.numpy
    unsigned = target.kind == "u"
    kind = array.dtype.kind
    if kind not in "iu" and not (kind == "O" and all(type(v) is int for v in array)):
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_UINT if unsigned else _NOT_INT}")
    if array.dtype == target:
        return array
    low, high = array.min(), array.max()
    if unsigned and low < 0:
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_UINT}")
    info = np.iinfo(target)
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise _input_error(head.name, f"Unable to parse 'data': value {bad} is out of range for {head.datatype.value}")
    return array.astype(target)


def _to_float(head: _InputHead, array: np.ndarray) -> np.ndarray:
    if array.dtype.kind not in "iuf":
        raise _input_error(head.name, f"Unable to parse 'data': {_NOT_NUMBER}")
    if head.datatype is _BF16:
        return float_to_bf16_bits(array)
    return array.astype(head.datatype.numpy, copy=False)


_CONVERT = {
    DataType.BOOL: _to_bool,
    **{dt: _to_int for dt in _INTS},
    **{dt: _to_float for dt in _FLOATS},
}


# --------------------------------------------------------------------------------------- outputs


def _decode_outputs(header: dict[str, Any]) -> list[RequestedOutput] | None:
    items = header.get("outputs", _MISSING)
    if items is _MISSING:
        return None
    if not isinstance(items, list):
        raise InvalidArgument(f"Unable to parse 'outputs': {_NOT_ARRAY}")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for item in items:
        output = _decode_output(item if isinstance(item, dict) else {})
        if output.name in seen:
            raise InvalidArgument(f"output '{output.name}' already exists in request")
        seen.add(output.name)
        outputs.append(output)
    # An empty list asks for nothing in particular, which Triton treats as "all outputs".
    return outputs or None


def _decode_output(item: dict[str, Any]) -> RequestedOutput:
    parameters = item.get("parameters")
    if isinstance(parameters, dict) and _SHM_REGION in parameters:
        _check_shm_output(parameters)
    name = _member_str(item, "name")
    if not isinstance(parameters, dict):
        return RequestedOutput(name)
    if "classification" in parameters and not _is_uint(parameters["classification"]):
        raise InvalidArgument(f"Unable to set 'classification': {_NOT_UINT}")
    if _SHM_REGION in parameters:
        _check_shm_parameters(parameters)
    if "binary_data" in parameters and not isinstance(parameters["binary_data"], bool):
        raise InvalidArgument(f"Unable to parse 'binary_data': {_NOT_BOOL}")
    return RequestedOutput(name, parameters)


def _check_shm_output(parameters: dict[str, Any]) -> None:
    """Triton checks these combinations before anything else about the output."""
    if "classification" in parameters:
        raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
    if parameters.get("binary_data") is True:
        raise InvalidArgument("Output can't set both 'shared_memory_region' and 'binary_data'")


# ------------------------------------------------------------------------------------ raw request


def decode_raw_request(
    body: bytes,
    spec: TensorSpec,
    input_count: int,
    model_name: str,
    model_version: int | None,
    *,
    batching: bool | None = None,
) -> InferRequest:
    """Decode a raw binary request (Inference-Header-Content-Length: 0): the whole body is the
    one input described by `spec`; all outputs come back binary.

    `input_count` is how many inputs the model has. `batching` says whether the model has
    max_batch_size > 0 (then `spec.shape` starts with the -1 batch dim and the request is a
    batch of 1); pass it: when None it is guessed from `spec.shape`, which cannot tell a
    batching model from a non-batching one whose first dim is variable.
    """
    if input_count != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got {input_count} "
            f"inputs in '{model_name}' model configuration"
        )
    if batching is None:
        batching = len(spec.shape) > 1 and spec.shape[0] == -1
    dims = spec.shape[1:] if batching else spec.shape
    if spec.datatype is _BYTES:
        shape, data = _raw_bytes_input(spec, dims, body, batching)
    else:
        shape = _raw_shape(spec, dims, len(body), batching)
        data = tensor_from_raw(spec.name, spec.datatype, shape, body, model_name)
    tensor = Tensor(spec.name, spec.datatype, shape, data)
    return InferRequest(model_name, model_version, [tensor], parameters={"binary_data_output": True})


def _raw_bytes_input(
    spec: TensorSpec, dims: tuple[int, ...], body: bytes, batching: bool
) -> tuple[tuple[int, ...], np.ndarray]:
    """A raw BYTES body is the one element itself, without a length prefix."""
    if -1 in dims or math.prod(dims) != 1:
        raise InvalidArgument(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
    shape = (1, *dims) if batching else tuple(dims)
    data = np.empty(1, dtype=object)
    data[0] = bytes(body)
    return shape, data.reshape(shape)


def _raw_shape(spec: TensorSpec, dims: tuple[int, ...], size: int, batching: bool) -> tuple[int, ...]:
    """The config dims with their one variable dim deduced from the body size."""
    variable = [i for i, dim in enumerate(dims) if dim == -1]
    if len(variable) > 1:
        raise InvalidArgument(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are more "
            "than one variable-sized dimension"
        )
    shape = list(dims)
    if variable:
        fixed = math.prod(dim for dim in dims if dim != -1) * spec.datatype.itemsize
        shape[variable[0]] = size // fixed if fixed else 0
    return (1, *shape) if batching else tuple(shape)


# ---------------------------------------------------------------------------------------- encode


def encode_infer_response(
    response: InferResponse, request: InferRequest, in_shared_memory: Collection[str] = ()
) -> tuple[bytes, int | None]:
    """Encode a successful response as (body, json_header_length or None when all-JSON).

    An output is binary when its requested output says `binary_data: true`; when the request
    listed no outputs, the request parameter `binary_data_output` decides for all of them.
    Outputs named in `in_shared_memory` were written to shared memory: they carry no data.
    Callers handle `response.error` themselves before calling this.
    """
    binary_default = request.outputs is None and request.parameters.get("binary_data_output") is True
    requested = {o.name: o.parameters.get("binary_data") is True for o in request.outputs or ()}
    blobs: list[bytes | memoryview] = []
    outputs = [
        _shm_output(tensor) if tensor.name in in_shared_memory
        else _encode_output(tensor, requested.get(tensor.name, binary_default), blobs)
        for tensor in response.outputs
    ]
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    header = _encoder.encode(document)
    if b"null" in header:
        # msgspec writes NaN/Infinity as null; Triton (rapidjson) writes the literals.
        header = _encode_non_finite(document, outputs)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def _shm_output(tensor: Tensor) -> dict[str, Any]:
    """An output written to shared memory: its metadata only (Triton adds no parameters)."""
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}


def _encode_output(tensor: Tensor, binary: bool, blobs: list[bytes | memoryview]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
    data = None if binary else _json_data(tensor)
    if data is None:  # binary asked for, or BYTES that are not UTF-8 and cannot be JSON strings
        raw = tensor_to_raw(tensor.data, tensor.datatype)
        blobs.append(raw)
        entry["parameters"] = {**tensor.parameters, "binary_data_size": len(raw)}
        return entry
    if tensor.parameters:
        entry["parameters"] = tensor.parameters
    entry["data"] = data
    return entry


def _json_data(tensor: Tensor) -> list[Any] | None:
    array = np.asarray(tensor.data)
    datatype = tensor.datatype
    if datatype is _BYTES:
        try:
            return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in array.flat]
        except UnicodeDecodeError:
            return None
    if datatype is _BF16:
        array = bf16_to_float32(array)
    elif datatype is _FP16:
        array = array.astype(np.float32)
    return array.ravel().tolist()


def _encode_non_finite(document: dict[str, Any], outputs: list[dict[str, Any]]) -> bytes:
    for entry in outputs:
        values = entry.get("data")
        if DataType(entry["datatype"]) in _FLOATS and values and not all(map(math.isfinite, values)):
            entry["data"] = msgspec.Raw(b"[" + b",".join(map(_float_json, values)) + b"]")
    return _encoder.encode(document)


def _float_json(value: float) -> bytes:
    if math.isnan(value):
        return b"NaN"
    if math.isinf(value):
        return b"Infinity" if value > 0 else b"-Infinity"
    return _encoder.encode(value)


def encode_error(message: str) -> bytes:
    """The JSON body of an error response: {"error": message}."""
    return _encoder.encode({"error": message})
