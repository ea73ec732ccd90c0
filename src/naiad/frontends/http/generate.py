"""Triton's generate extension (SPEC §1.14): `POST /v2/models/{m}[/versions/{v}]/generate` and
`.../generate_stream`, a flat-JSON front door to any model, decoupled or not.

Request: each top-level key that names a model input becomes that input (a JSON scalar or 1-D
list, shaped to the input's dims); `id` is also the request id; every other key, and each key of
a `parameters` object, becomes a request parameter (or an input, when it names one).

Response: `model_name`, `model_version`, `id` when set, each response parameter and each output by
name, a one-element output as a bare scalar. `/generate` answers exactly one response as JSON;
`/generate_stream` sends each response as a server-sent event `data: {...}\\n\\n` as it arrives.
Errors before inference are ordinary JSON errors; once the stream has begun, an error is an
event `data: {"error": ...}` and the status stays what the first response set.

Texts and behaviour follow Triton's http_server.cc (HandleGenerate, GenerateRequestClass).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError, Unsupported
from naiad.frontends.http.codec import encode_error
from naiad.frontends.http.reply import HTTP_STATUS, SSE_CONTENT_TYPE, Headers, Reply, StreamReply
from naiad.frontends.http.routes import Route
from naiad.frontends.http.tracing import carry_trace
from naiad.frontends.tensors import bf16_to_float32, float_to_bf16_bits
from naiad.types import DataType, InferRequest, InferResponse, Tensor, TensorSpec

NOT_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                    "generates various number of responses")

_PARAMETERS = "parameters"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_NUMBER = "attempt to access JSON non-number as double"
_INT64 = (-(2**63), 2**63 - 1)
_FLOATS = frozenset({DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16})
_encoder = msgspec.json.Encoder()


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs: Triton walks members in order, duplicates included."""


# ---------------------------------------------------------------------------------------- handlers


async def generate(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    await server.loaded(route.model)  # decoding needs the model's inputs
    request = _decode(server, route, body)
    carry_trace(server, request, headers)
    answers = [r async for r in server.stream(request) if not _flags_only(r)]
    if len(answers) != 1:
        # Triton sends this after a 200 status line it has already written (its reply is chunked);
        # naiad knows the count before answering, so the failure gets a failing status too.
        raise InternalError(NOT_ONE_RESPONSE)
    response = answers[0]
    if response.error is not None:
        raise _as_error(response.error)
    return Reply(200, encode_generate_response(response))


async def generate_stream(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    await server.loaded(route.model)  # decoding needs the model's inputs
    request = _decode(server, route, body)
    carry_trace(server, request, headers)
    # server.stream is an async generator: closing it marks the request cancelled.
    events = _Events(cast(AsyncGenerator[InferResponse, None], server.stream(request)))
    status = await events.start()
    return StreamReply(status, events, SSE_CONTENT_TYPE)


class _Events:
    """The server-sent events of one request's responses, read as the protocol writes them."""

    def __init__(self, responses: AsyncGenerator[InferResponse, None]) -> None:
        self._responses = responses
        self._first: InferResponse | None = None

    async def start(self) -> int:
        """Wait for the first response, whose outcome is the HTTP status (as in Triton, which
        starts its chunked reply then); errors before queueing raise here, before any byte is sent."""
        self._first = await anext(self._responses)
        error = self._first.error
        return 200 if error is None else HTTP_STATUS.get(_as_error(error).status, 400)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._first is not None:
                response, self._first = self._first, None
            else:
                response = await anext(self._responses)  # StopAsyncIteration ends the body
            event = _event(response)
            if event is not None:
                return event

    async def aclose(self) -> None:
        await self._responses.aclose()


def _event(response: InferResponse) -> bytes | None:
    """One SSE event, or None for a flags-only final response (Triton sends nothing for it)."""
    if response.error is not None:
        data = encode_error(_as_error(response.error).message)
    elif _flags_only(response):
        return None
    else:
        try:
            data = encode_generate_response(response)
        except NaiadError as error:
            data = encode_error(error.message)
    return b"data: " + data + b"\n\n"


def _flags_only(response: InferResponse) -> bool:
    """A decoupled model's closing response that carries nothing but the final flag."""
    return response.final and response.error is None and not response.outputs and not response.parameters


def _as_error(error: Exception) -> NaiadError:
    return error if isinstance(error, NaiadError) else InternalError(str(error))


def _decode(server: InferenceServer, route: Route, body: bytes) -> InferRequest:
    # Like Triton, look the model up first: an unknown model fails before the body is read.
    model = route.model or ""
    inputs, _ = server.model_inputs(model, route.version)
    return decode_generate_request(body, inputs, model, route.version)


# ------------------------------------------------------------------------------------------ decode


def decode_generate_request(body: bytes, inputs: list[TensorSpec], model_name: str,
                            model_version: int | None) -> InferRequest:
    """The InferRequest of a generate body for a model with these inputs (shapes as clients see
    them, batch dimension included)."""
    members = _parse(body)
    request = InferRequest(model_name, model_version, [])
    specs = {spec.name: spec for spec in inputs}
    for key, value in members:
        if key == "id":
            if not isinstance(value, str):
                raise InvalidArgument(f"Unable to parse 'id': {_NOT_STRING}")
            request.id = value  # and, as in Triton, it is mapped like any other key below
        if key == _PARAMETERS:
            _map_parameters(value, specs, request)
        else:
            _map(key, value, specs, request)
    return request


def _parse(body: bytes) -> _Object:
    try:
        document = json.loads(body, object_pairs_hook=_Object)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise InvalidArgument(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, _Object):
        raise InvalidArgument("attempt to get members for non-object")
    return document


def _map_parameters(value: Any, specs: dict[str, TensorSpec], request: InferRequest) -> None:
    """The reserved `parameters` object: its keys map like top-level ones."""
    if _PARAMETERS in specs:
        raise InvalidArgument(f"Keyword '{_PARAMETERS}' for nested schema also given as input tensor name")
    if not isinstance(value, _Object):
        raise InvalidArgument(
            f"Expected JSON object for keyword: '{_PARAMETERS}': attempt to access JSON non-object as object"
        )
    try:
        for key, item in value:
            _map(key, item, specs, request)
    except NaiadError as error:
        raise type(error)(f"Converting keyword: '{_PARAMETERS}': {error.message}", error.status) from None


def _map(key: str, value: Any, specs: dict[str, TensorSpec], request: InferRequest) -> None:
    spec = specs.get(key)
    if spec is None:
        request.parameters[key] = _parameter(key, value)
        return
    if any(tensor.name == key for tensor in request.inputs):
        raise InvalidArgument(f"input '{key}' already exists in request")
    request.inputs.append(_tensor(spec, value))


def _parameter(key: str, value: Any) -> str | int | float | bool:
    if isinstance(value, str | bool | float):
        return value
    if isinstance(value, int):
        # Triton keeps integers that fit int64 and reads larger ones as doubles.
        return value if _INT64[0] <= value <= _INT64[1] else float(value)
    raise InvalidArgument(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _tensor(spec: TensorSpec, value: Any) -> Tensor:
    values = value if isinstance(value, list) else [value]
    if spec.datatype is DataType.BYTES:
        # Triton sizes the strings before it looks at the shape, so their errors come first.
        data = _bytes_elements(values)
        shape = _shape(spec, len(values))
    else:
        shape = _shape(spec, len(values))
        data = _numeric_elements(spec.datatype, values)
    return Tensor(spec.name, spec.datatype, shape, data.reshape(shape))


def _shape(spec: TensorSpec, count: int) -> tuple[int, ...]:
    """Fit `count` elements to the input's dims: fixed dims must divide it, the innermost
    variable dim takes what is left and the other variable dims (the batch one too) are 1."""
    shape = [1 if d == -1 else d for d in spec.shape]
    variable = [i for i, d in enumerate(spec.shape) if d == -1]
    fixed = math.prod(d for d in spec.shape if d != -1)
    if fixed == 0:
        fits = count == 0
    else:
        left, rest = divmod(count, fixed)
        fits = rest == 0 and (left == 1 or bool(variable))
        if variable:
            shape[variable[-1]] = left
    if not fits:
        raise InvalidArgument(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
    return tuple(shape)


def _bytes_elements(values: list[Any]) -> np.ndarray:
    if not all(isinstance(v, str) for v in values):
        raise InvalidArgument(f"Unable to parse JSON bytes array: {_NOT_STRING}")
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode("utf-8", "surrogatepass") for v in values]
    return array


def _numeric_elements(datatype: DataType, values: list[Any]) -> np.ndarray:
    # JSON true/false are not numbers to Triton, although Python's bool is an int.
    if datatype is DataType.BOOL:
        if not all(type(v) is bool for v in values):
            raise InvalidArgument(f"Unable to parse 'data': {_NOT_BOOL}")
        return np.array(values, dtype=np.bool_)
    if datatype in _FLOATS:
        if not all(type(v) in (int, float) for v in values):
            raise InvalidArgument(f"Unable to parse 'data': {_NOT_NUMBER}")
        try:
            floats = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer beyond any double
            raise InvalidArgument(f"Unable to parse 'data': value out of range for {datatype.value}") from None
        return float_to_bf16_bits(floats) if datatype is DataType.BF16 else floats.astype(datatype.numpy)
    return _integers(datatype, values)


def _integers(datatype: DataType, values: list[Any]) -> np.ndarray:
    info = np.iinfo(datatype.numpy)
    unsigned = info.min == 0
    for v in values:
        if type(v) is not int or (unsigned and v < 0):
            raise InvalidArgument(f"Unable to parse 'data': {_NOT_UINT if unsigned else _NOT_INT}")
        if not info.min <= v <= info.max:
            raise InvalidArgument(f"Unable to parse 'data': value {v} is out of range for {datatype.value}")
    return np.array(values, dtype=datatype.numpy)


# ------------------------------------------------------------------------------------------ encode


def encode_generate_response(response: InferResponse) -> bytes:
    """The flat JSON of one successful response. Triton collects the fields in a map keyed by
    name, so the first of a name wins (reserved fields, then parameters, then outputs) and the
    keys come out sorted."""
    fields: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        fields["id"] = response.id
    for name, value in response.parameters.items():
        if isinstance(value, bytes | bytearray):
            raise Unsupported(f"Response parameter '{name}' has type 'TRITONSERVER_PARAMETER_BYTES' which is "
                              "not currently supported")
        fields.setdefault(name, value)
    for tensor in response.outputs:
        fields.setdefault(tensor.name, _output_json(tensor))
    return _encoder.encode(dict(sorted(fields.items())))


def _output_json(tensor: Tensor) -> Any:
    array = np.asarray(tensor.data)
    datatype = tensor.datatype
    values: list[Any]
    if datatype is DataType.BYTES:
        # JSON strings can only carry text; bytes that are not UTF-8 come out with replacements.
        values = [b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b) for b in array.flat]
    elif datatype is DataType.BF16:
        values = bf16_to_float32(array).ravel().tolist()
    else:
        values = array.ravel().tolist()
    value: Any = values[0] if len(values) == 1 else values
    if datatype in _FLOATS and not all(map(math.isfinite, values)):
        # msgspec would write null; Triton (rapidjson) writes NaN / Infinity, as json.dumps does.
        return msgspec.Raw(json.dumps(value, separators=(",", ":")).encode())
    return value
