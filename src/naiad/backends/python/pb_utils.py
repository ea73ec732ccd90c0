"""naiad's `triton_python_backend_utils`: the API Triton `model.py` files import as `pb_utils`.

The model process aliases this module as `sys.modules["triton_python_backend_utils"]`. It and its
parts (pb_args, pb_errors, pb_runtime, pb_tensor, pb_config, pb_metrics, pb_model_control,
pb_logger) import only the standard library, numpy, each other and the naming rules of
`naiad.observability.custom_metrics` (standard library only): they also run under a model's own
environment (EXECUTION_ENV_PATH).
Names, signatures, defaults and error messages follow Triton's python_backend (the Python half in
`triton_python_backend_utils.py`, the C++ half bound by `pb_stub.cc`); where naiad differs the
comment at that spot says why. Arguments are converted as upstream's pybind11 bindings convert
them (pb_args): bytes where a C++ string is declared, numpy integers where an integer is, any
sequence where a list is.

Everything that needs the server goes through one module-level runtime object that the model
process installs with `_set_runtime(runtime)` (see `Runtime`). Without one (unit tests, the
auto-complete process) the pure parts work, `Logger` writes to stderr as the upstream stub does
before its log channel is up, and BLS, response senders and model control raise a
`TritonModelException` that says no runtime is attached.
"""

from __future__ import annotations

import enum
import json
import operator
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from naiad.backends.python import pb_runtime
from naiad.backends.python.pb_args import as_bool, as_int, as_list, as_str, as_str_list
from naiad.backends.python.pb_config import ModelConfig
from naiad.backends.python.pb_errors import TritonError, TritonModelException
from naiad.backends.python.pb_logger import Logger
from naiad.backends.python.pb_metrics import Metric, MetricFamily, MetricKind
from naiad.backends.python.pb_model_control import is_model_ready, load_model, unload_model
from naiad.backends.python.pb_runtime import NO_RUNTIME, Runtime
from naiad.backends.python.pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

# The names model.py files use come from the modules above; the model process aliases this
# module as `triton_python_backend_utils`, so they are all reachable as `pb_utils.<name>`.
__all__ = [
    "TRITON_STRING_TO_NUMPY", "InferenceRequest", "InferenceResponse", "InferenceResponseSender",
    "InferenceTrace", "Logger", "MemoryType", "Metric", "MetricFamily", "MetricKind", "ModelConfig",
    "PreferredMemory", "Runtime", "Tensor", "TritonError", "TritonModelException", "deserialize_bytes_tensor",
    "get_input_config_by_name", "get_input_tensor_by_name", "get_output_config_by_name",
    "get_output_tensor_by_name", "is_model_ready", "load_model", "numpy_to_triton_type",
    "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type", "unload_model",
    "using_decoupled_model_transaction_policy",
]


def _set_runtime(runtime: Runtime | None) -> None:
    """Attach (or, with None, detach) the model process's runtime."""
    pb_runtime.install(runtime)


def _get_runtime() -> Runtime | None:
    return pb_runtime.get()

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
        self._type = as_int(preferred_memory_type, "PreferredMemory(): preferred_memory_type")
        self._device_id = as_int(preferred_device_id, "PreferredMemory(): preferred_device_id")

    # Upstream binds no accessors; these let the runtime read the preference of a BLS request.
    @property
    def preferred_memory_type(self) -> int:
        return self._type

    @property
    def preferred_device_id(self) -> int:
        return self._device_id

    def __repr__(self) -> str:
        return f"PreferredMemory({self._type}, {self._device_id})"


_DEFAULT_MEMORY = PreferredMemory(_MEMORY_DEFAULT, 0)  # immutable: every received request shares it


class InferenceTrace:
    """The trace a request carries; pass `request.trace()` to a BLS `InferenceRequest` so the child
    request joins the same trace. Models cannot build one with content, as upstream."""

    def __init__(self) -> None:
        self._context: str | None = None
        self._handle: object = None  # the runtime's own reference to the server-side trace

    def get_context(self) -> str | None:
        """The trace context (JSON text, e.g. OpenTelemetry propagation headers), or None."""
        return self._context or None

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


# -- parameters ------------------------------------------------------------------------------


def _parameters_json(parameters: Any) -> str:
    """Upstream's PyParametersToJSON: a dict of str -> bool/int/str (or None) as JSON text."""
    if parameters is None or (isinstance(parameters, dict) and not parameters):
        return "{}"  # most responses: json.dumps would cost ~8 µs each
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
        if None in tensors:  # (Tensor has no __eq__: this compares identities)
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse(): error must be a TritonError or None, got {type(error)}")
        self._output_tensors: list[Tensor] = tensors  # type: ignore[assignment]  # (no None: checked above)
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
    """A `std::vector<Tensor>` argument: any sequence of Tensors (None items are checked by the caller)."""
    if values is None:
        return []
    items = as_list(values, argument)
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
        flags = as_int(flags, "send(): flags", bits=32, signed=False)
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
        runtime = pb_runtime.get()
        if runtime is None:
            raise TritonModelException(f"Unable to send response. {NO_RUNTIME}.")
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

    # What the sender's state is (tests look; the server tracks open requests itself).
    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _responses_sent(self) -> int:
        with self._lock:
            return self._sent



def _is_cancelled(handle: object) -> bool:
    runtime = pb_runtime.get()
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
        # Converted as upstream's pybind11 signature converts them (see pb_args): e.g. model_name
        # may be the bytes element of a BYTES tensor, model_version a numpy integer.
        request_id = as_str(request_id, "InferenceRequest(): request_id")
        model_name = as_str(model_name, "InferenceRequest(): model_name")
        correlation_id = _correlation_id(correlation_id)
        model_version = as_int(model_version, "InferenceRequest(): model_version")
        flags = as_int(flags, "InferenceRequest(): flags", bits=32, signed=False)
        timeout = as_int(timeout, "InferenceRequest(): timeout", signed=False)
        tensors = _tensor_list(inputs, "inputs")
        if any(tensor is None for tensor in tensors):
            raise TritonModelException(
                f"Input tensor for request with id '{request_id}' and model name '{model_name}' should not be empty.")
        names = as_str_list(requested_output_names, "InferenceRequest(): requested_output_names")
        for output in names:
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
            inputs=inputs, request_id=request_id, correlation_id=correlation_id, flags=flags,
            timeout=timeout, parameters=parameters or "{}", requested_output_names=requested_output_names,
            model_name=model_name, model_version=model_version, handle=handle, decoupled=decoupled,
            trace=trace if trace is not None else InferenceTrace(), preferred_memory=_DEFAULT_MEMORY)
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
        self._flags = as_int(flags, "set_flags(): flags", bits=32, signed=False)

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
        self._release_flags = as_int(flags, "set_release_flags(): flags", bits=32, signed=False)

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on `model_name` and wait: the response, or with `decoupled=True` an
        iterator over the responses that also has `cancel()`."""
        runtime = pb_runtime.get()
        if runtime is None:
            raise TritonModelException(f"BLS is only supported during the 'execute' function ({NO_RUNTIME}).")
        return runtime.exec(self, as_bool(decoupled, "exec(): decoupled"))

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """`exec` for `async def execute`: `await request.async_exec()` (or gather several)."""
        runtime = pb_runtime.get()
        if runtime is None:
            raise TritonModelException(f"BLS is only supported during the 'execute' function ({NO_RUNTIME}).")
        return await runtime.async_exec(self, as_bool(decoupled, "async_exec(): decoupled"))

    def __repr__(self) -> str:
        return (f"InferenceRequest(request_id={self._request_id!r}, model_name={self._model_name!r}, "
                f"inputs={[tensor.name() for tensor in self._inputs]})")


def _correlation_id(value: Any) -> int | str:
    """Upstream takes an int (bool included: it is one) or a str; a numpy integer is taken too."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) or (hasattr(type(value), "__index__") and not isinstance(value, bytes)):
        number = operator.index(value)
        if not 0 <= number < 2**64:
            raise TritonModelException("Correlation ID must be an unsigned 64-bit integer or a string")
        return number
    raise TritonModelException("Correlation ID must be integer or string")
