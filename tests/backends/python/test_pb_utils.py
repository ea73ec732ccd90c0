"""pb_utils (naiad's triton_python_backend_utils) against a fake runtime: the behaviour and the
error messages model.py files see under Triton's python_backend."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import re
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class FakeRuntime:
    """Records what pb_utils hands the model process; answers from canned values."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, pb_utils.InferenceResponse | None, int]] = []
        self.logs: list[tuple[int, str, str, int]] = []
        self.execs: list[tuple[pb_utils.InferenceRequest, bool]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.cancelled: set[object] = set()
        self.fail_with: Exception | None = None
        self.ready = True

    def send(self, handle: object, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append((handle, response, flags))

    def is_cancelled(self, handle: object) -> bool:
        return handle in self.cancelled

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        self.execs.append((request, decoupled))
        response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.0], np.float32))])
        if decoupled:
            return iter([response, pb_utils.InferenceResponse()])
        return response

    async def async_exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        await asyncio.sleep(0)
        return self.exec(request, decoupled)

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        self.logs.append((level, message, filename, line))

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("load", model_name, config, files))

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("unload", model_name, unload_dependents))

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("ready", model_name, model_version))
        return self.ready


class MetricRuntime(FakeRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def metric(self, event: dict[str, Any]) -> None:
        self.events.append(event)


@pytest.fixture(autouse=True)
def _no_runtime_left_behind() -> Iterator[None]:
    pb_utils._set_runtime(None)
    yield
    pb_utils._set_runtime(None)


@pytest.fixture
def runtime() -> FakeRuntime:
    fake = FakeRuntime()
    pb_utils._set_runtime(fake)
    return fake


def received(handle: object = "h1", *, decoupled: bool | None = False, outputs: list[str] | None = None,
             **fields: Any) -> pb_utils.InferenceRequest:
    values: dict[str, Any] = {
        "inputs": [pb_utils.Tensor("IN", np.arange(4, dtype=np.float32))], "request_id": "r1",
        "correlation_id": 0, "flags": 0, "timeout": 0, "parameters": '{"k": 1}',
        "requested_output_names": outputs if outputs is not None else ["OUT"], "model_name": "m",
        "model_version": 1, "handle": handle, "decoupled": decoupled,
    }
    values.update(fields)
    return pb_utils.InferenceRequest._received(**values)


def response(*names: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, np.zeros(2, np.int32)) for name in names or ("OUT",)])


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


# -- errors and responses --------------------------------------------------------------------


def test_triton_error() -> None:
    error = pb_utils.TritonError("no such file", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code(), str(error)) == ("no such file", 2, "no such file")
    assert pb_utils.TritonError("boom").code() == pb_utils.TritonError.INTERNAL
    assert pb_utils.TritonError(message="m", code=7).code() == pb_utils.TritonError.CANCELLED
    with pytest.raises(TypeError):
        pb_utils.TritonError("m", 42)
    with pytest.raises(TypeError):
        pb_utils.TritonError(None)  # type: ignore[arg-type]
    assert issubclass(pb_utils.TritonModelException, Exception)
    assert pb_utils.TritonModelException("why").message() == "why"


def test_inference_response_accessors() -> None:
    out = pb_utils.Tensor("OUT", np.ones(2))
    reply = pb_utils.InferenceResponse(output_tensors=[out], parameters={"a": True, "b": 3, "c": "x"})
    assert reply.output_tensors() == [out] and not reply.has_error() and reply.error() is None
    assert json.loads(reply.parameters()) == {"a": True, "b": 3, "c": "x"}
    reply.output_tensors().clear()  # a copy, as upstream's list conversion
    assert len(reply.output_tensors()) == 1
    assert pb_utils.get_output_tensor_by_name(reply, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(reply, "NOPE") is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG))
    assert failed.has_error() and failed.error().code() == pb_utils.TritonError.INVALID_ARG
    empty = pb_utils.InferenceResponse()
    assert (empty.output_tensors(), empty.parameters()) == ([], "{}")
    with pytest.raises(E, match=r"^Output tensor for inference response should not be empty\.$"):
        pb_utils.InferenceResponse([None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse([np.ones(2)])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse([], error="bad")  # type: ignore[arg-type]


@pytest.mark.parametrize(("parameters", "message"), [
    ([], "Expect dict, got <class 'list'>"),
    ('{"a": 1}', "Expect dict, got <class 'str'>"),  # upstream takes a dict only
    ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
    ({"int": 2, "float": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ({"bool": True, "null": None}, "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
    ({"str": "", "list": ["v"]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ({"n": np.int64(1)}, "found type <class 'numpy.int64'>"),
])
def test_parameters_validation(parameters: Any, message: str) -> None:
    with pytest.raises(E, match=re.escape(message)):
        pb_utils.InferenceResponse([], parameters=parameters)
    with pytest.raises(E, match=re.escape(message)):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters=parameters)


# -- requests --------------------------------------------------------------------------------


def test_received_request_accessors(runtime: FakeRuntime) -> None:
    trace = pb_utils.InferenceTrace()
    request = received(correlation_id="seq-7", flags=3, timeout=500, trace=trace, outputs=["B", "A", "B"])
    assert [t.name() for t in request.inputs()] == ["IN"]
    assert pb_utils.get_input_tensor_by_name(request, "IN") is request.inputs()[0]
    assert pb_utils.get_input_tensor_by_name(request, "X") is None
    assert (request.request_id(), request.correlation_id()) == ("r1", "seq-7")
    assert (request.flags(), request.timeout()) == (3, 500)
    assert json.loads(request.parameters()) == {"k": 1}
    assert request.requested_output_names() == {"A", "B"}  # a set, as upstream's std::set
    assert (request.model_name(), request.model_version()) == ("m", 1)
    assert request.trace() is trace and trace.get_context() is None
    assert request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request._release_flags == 2
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert request.flags() == 2
    assert not request.is_cancelled()
    runtime.cancelled.add("h1")
    assert request.is_cancelled() and request.get_response_sender().is_cancelled()


def test_bls_request_construction() -> None:
    tensor = pb_utils.Tensor("IN", np.zeros(2, np.float32))
    request = pb_utils.InferenceRequest(model_name="add", inputs=[tensor], requested_output_names=["OUT"])
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("", 0, 0, 0)
    assert (request.model_version(), request.parameters(), request.trace().get_context()) == (-1, "{}", None)
    assert request.inputs() == [tensor] and not request.is_cancelled()
    assert request._preferred_memory.preferred_memory_type == 2  # upstream's DEFAULT
    full = pb_utils.InferenceRequest(
        model_name="add", inputs=[tensor], requested_output_names=["OUT"], request_id="1", correlation_id="ex-4",
        model_version=3, flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, timeout=5,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU), trace=request.trace(),
        parameters={"p": "v"})
    assert (full.correlation_id(), full.model_version(), full.flags(), full.timeout()) == ("ex-4", 3, 1, 5)
    assert full.parameters() == '{"p": "v"}' and full.trace() is request.trace()
    for missing in ({"inputs": []}, {"requested_output_names": []}, {"model_name": "m", "inputs": []}):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**missing)
    with pytest.raises(E, match=r"^Correlation ID must be integer or string$"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=1.5)
    with pytest.raises(E, match=r"^Input tensor for request with id 'x' and model name 'm' should not be empty\.$"):
        pb_utils.InferenceRequest(request_id="x", model_name="m", inputs=[None], requested_output_names=[])
    with pytest.raises(E, match=r"^Requested output name for request with id '' and model name 'm' should not be"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[""])
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names="OUT")
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], timeout=-1)
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], preferred_memory=None)


def test_bls_exec_goes_through_the_runtime(runtime: FakeRuntime) -> None:
    request = pb_utils.InferenceRequest(model_name="add", inputs=[], requested_output_names=["OUT"])
    reply = request.exec()
    assert isinstance(reply, pb_utils.InferenceResponse)
    assert pb_utils.get_output_tensor_by_name(reply, "OUT").as_numpy().tolist() == [1.0]
    stream = request.exec(decoupled=True)
    assert [len(r.output_tensors()) for r in stream] == [1, 0]
    assert runtime.execs == [(request, False), (request, True)]

    async def gather() -> list[Any]:
        return await asyncio.gather(request.async_exec(), request.async_exec(decoupled=True))

    single, streamed = asyncio.run(gather())
    assert isinstance(single, pb_utils.InferenceResponse) and len(list(streamed)) == 2
    assert [decoupled for _, decoupled in runtime.execs[2:]] == [False, True]


def test_bls_without_runtime_is_a_clear_error() -> None:
    request = pb_utils.InferenceRequest(model_name="add", inputs=[], requested_output_names=["OUT"])
    with pytest.raises(E, match=r"^BLS is only supported during the 'execute' function \(no naiad runtime"):
        request.exec()
    with pytest.raises(E, match="BLS is only supported during the 'execute' function"):
        asyncio.run(request.async_exec())


# -- response senders ------------------------------------------------------------------------


def test_sender_is_cached_and_checks_its_arguments(runtime: FakeRuntime) -> None:
    request = received()
    sender = request.get_response_sender()
    assert request.get_response_sender() is sender
    with pytest.raises(E, match=r"^Unable to send response\. Unsupported flag provided\.$"):
        sender.send(response(), flags=2)
    with pytest.raises(E, match=r"^Inference Response object must be provided when the response flags is set to "
                                r"zero\.$"):
        sender.send()
    assert runtime.sent == [] and not sender._is_closed()


def test_decoupled_sender_sends_many_then_closes(runtime: FakeRuntime) -> None:
    sender = received(decoupled=True).get_response_sender()
    first, second = response(), response()
    sender.send(first)
    sender.send(second)
    sender.send(flags=FINAL)
    assert runtime.sent == [("h1", first, 0), ("h1", second, 0), ("h1", None, FINAL)]
    assert sender._is_closed() and sender._responses_sent() == 3
    with pytest.raises(E, match=r"^Unable to send response\. Response sender has been closed\.$"):
        sender.send(response())
    with pytest.raises(E, match="Response sender has been closed"):
        sender.send(flags=FINAL)


def test_non_decoupled_sender_allows_exactly_one_response(runtime: FakeRuntime) -> None:
    sender = received(decoupled=False).get_response_sender()
    with pytest.raises(E, match=r"^Unable to send response\. Non-decoupled model cannot send complete final before "
                                r"sending a response\.$"):
        sender.send(flags=FINAL)
    sender.send(response())
    with pytest.raises(E, match=r"^Unable to send response\. Non-decoupled model cannot send more than one "
                                r"response\.$"):
        sender.send(response())
    sender.send(flags=FINAL)
    with pytest.raises(E, match="Non-decoupled model cannot send more than one response"):
        sender.send(response(), flags=FINAL)  # checked before "closed", as upstream
    with pytest.raises(E, match="Response sender has been closed"):
        sender.send(flags=FINAL)
    # one response carrying the final flag is the other valid shape
    other = received("h2", decoupled=False).get_response_sender()
    other.send(response(), flags=FINAL)
    assert [(h, f) for h, _, f in runtime.sent] == [("h1", 0), ("h1", FINAL), ("h2", FINAL)]


def test_sender_without_decoupled_state_leaves_the_count_to_the_server(runtime: FakeRuntime) -> None:
    sender = received(decoupled=None).get_response_sender()
    sender.send(flags=FINAL)  # a non-decoupled model's sender would refuse this
    assert runtime.sent == [("h1", None, FINAL)]


def test_sender_prunes_unrequested_outputs(runtime: FakeRuntime) -> None:
    sender = received(decoupled=True, outputs=["A"]).get_response_sender()
    sender.send(response("A", "B"), flags=FINAL)
    assert [t.name() for t in runtime.sent[0][1].output_tensors()] == ["A"]
    everything = received("h2", decoupled=True, outputs=[]).get_response_sender()
    everything.send(response("A", "B"), flags=FINAL)
    assert [t.name() for t in runtime.sent[1][1].output_tensors()] == ["A", "B"]


def test_sender_of_a_bls_request_and_without_runtime() -> None:
    bls = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(E, match=r"^Unable to send response\. Response sender has no reference to the decoupled state"):
        bls.get_response_sender().send(response())
    sender = received().get_response_sender()
    with pytest.raises(E, match=r"^Unable to send response\. no naiad runtime is attached"):
        sender.send(response(), flags=FINAL)
    assert not sender._is_closed()  # nothing was sent, the model may still answer


def test_sender_errors_from_the_runtime_become_model_exceptions(runtime: FakeRuntime) -> None:
    runtime.fail_with = ConnectionError("server went away")
    with pytest.raises(E, match=r"^server went away$"):
        received(decoupled=True).get_response_sender().send(response())


def test_sender_is_thread_safe(runtime: FakeRuntime) -> None:
    sender = received(decoupled=True).get_response_sender()
    failures: list[BaseException] = []

    def finish() -> None:
        try:
            sender.send(flags=FINAL)
        except E as error:
            failures.append(error)

    threads = [threading.Thread(target=finish) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runtime.sent) == 1 and len(failures) == 15


# -- model control ---------------------------------------------------------------------------


def test_model_control_goes_through_the_runtime(runtime: FakeRuntime) -> None:
    pb_utils.load_model("onnx")
    pb_utils.load_model(model_name="onnx", config='{"backend": "onnxruntime"}', files={"file:1/model.onnx": b"\x08"})
    pb_utils.unload_model("onnx", unload_dependents=True)
    assert pb_utils.is_model_ready("onnx") is True
    assert pb_utils.is_model_ready("onnx", model_version="2") is True
    assert runtime.calls == [
        ("load", "onnx", "", None), ("load", "onnx", '{"backend": "onnxruntime"}', {"file:1/model.onnx": b"\x08"}),
        ("unload", "onnx", True), ("ready", "onnx", ""), ("ready", "onnx", "2")]
    with pytest.raises(E, match=r"^failed to load model 'onnx', files should be a dictionary of file paths and file "
                                r"contents$"):
        pb_utils.load_model("onnx", config="{}", files=[("file:1/model.onnx", b"")])  # type: ignore[arg-type]
    with pytest.raises(E, match=r"^Failed to check model readiness: failed to get model version from specified "
                                r"version string 'latest' \(details: stol\), version should be an integral value > 0$"):
        pb_utils.is_model_ready("onnx", "latest")
    with pytest.raises(E, match=r"version string '-1', version should be an integral value > 0$"):
        pb_utils.is_model_ready("onnx", "-1")
    runtime.fail_with = RuntimeError("load failed: not in explicit mode")
    with pytest.raises(E, match=r"^Failed to load model: load failed: not in explicit mode$"):
        pb_utils.load_model("onnx")
    with pytest.raises(E, match=r"^Failed to unload model: "):
        pb_utils.unload_model("onnx")
    with pytest.raises(E, match=r"^Failed to check model readiness: "):
        pb_utils.is_model_ready("onnx")


def test_model_control_without_runtime() -> None:
    with pytest.raises(E, match=r"^Failed to load model: no naiad runtime"):
        pb_utils.load_model("m")
    with pytest.raises(E, match=r"^Failed to unload model: no naiad runtime"):
        pb_utils.unload_model("m")
    with pytest.raises(E, match=r"^Failed to check model readiness: no naiad runtime"):
        pb_utils.is_model_ready("m")


# -- logging ---------------------------------------------------------------------------------


def test_logger_reports_the_callers_file_and_line(runtime: FakeRuntime) -> None:
    logger = pb_utils.Logger
    line = sys._getframe().f_lineno
    logger.log_info("info")
    logger.log_warn("warn")
    logger.log_error("error")
    logger.log_verbose("verbose")
    logger.log("default level")
    logger.log("explicit", logger.ERROR)
    pb_utils.Logger.log(message="enum", level=pb_utils.Logger.LogLevel.WARNING)
    assert runtime.logs == [
        (0, "info", __file__, line + 1), (1, "warn", __file__, line + 2), (2, "error", __file__, line + 3),
        (3, "verbose", __file__, line + 4), (0, "default level", __file__, line + 5),
        (2, "explicit", __file__, line + 6), (1, "enum", __file__, line + 7)]
    with pytest.raises(TypeError):
        logger.log("bad level", 9)
    with pytest.raises(TypeError):
        logger.log_info(42)  # type: ignore[arg-type]


def test_logger_without_runtime_writes_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    line = sys._getframe().f_lineno
    pb_utils.Logger.log_warn("careful")
    err = capsys.readouterr().err
    # upstream's pre-channel format: W<mmdd hh:mm:ss.uuuuuu> <pid> <file>:<line>]  <message>
    assert err.startswith("W") and err.endswith(f" test_pb_utils.py:{line + 1}]  careful\n")


# -- auto-complete config --------------------------------------------------------------------

BASE = {"name": "m", "max_batch_size": 0, "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": []}


def test_model_config_builds_and_completes() -> None:
    source = json.loads(json.dumps(BASE))
    config = pb_utils.ModelConfig(source)
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    config.add_input({"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    result = config.as_dict()
    assert result["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True},
                               {"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]}]
    assert result["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]
    assert (result["max_batch_size"], result["dynamic_batching"]) == (8, {})
    assert pb_utils.using_decoupled_model_transaction_policy(result) is True
    assert pb_utils.get_input_config_by_name(result, "IN2")["data_type"] == "TYPE_INT32"
    assert pb_utils.get_output_config_by_name(result, "OUT")["dims"] == [4]
    assert pb_utils.get_input_config_by_name(result, "X") is None
    assert pb_utils.get_output_config_by_name({}, "X") is None
    assert source == BASE  # the model edits its own copy
    assert pb_utils.ModelConfig(json.dumps(BASE)).as_dict() == BASE  # upstream's form: JSON text
    not_decoupled = {"model_transaction_policy": {"decoupled": False}}
    assert pb_utils.using_decoupled_model_transaction_policy(not_decoupled) is False
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    # a TYPE_INVALID / dims-less entry from a config without types takes the model's
    untyped = pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [
        {"name": "IN", "data_type": "TYPE_INVALID", "dims": []}], "output": []})
    untyped.add_input({"name": "IN", "data_type": "TYPE_FP16", "dims": [2]})
    assert untyped.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP16", "dims": [2]}]


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1}),
     "input 'X' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type', "
     "'dims' and 'optional'."),
    (lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
     "output 'Y' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type' "
     "and 'dims'."),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}),
     "input in auto-complete-config function for model 'm' is missing 'name' property."),
    (lambda c: c.add_output({"name": "Y", "dims": [1]}),
     "output 'Y' in auto-complete-config function for model 'm' is missing 'data_type' property."),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32"}),
     "input 'X' in auto-complete-config function for model 'm' is missing 'dims' property."),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]}),
     "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT8"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2, 2]}),
     "model 'm', tensor 'IN': the model expects dims [2, 2] but the model configuration specifies dims [4]"),
    (lambda c: c.set_max_batch_size(4),
     "configuration specified max_batch_size 8, but in auto-complete-config function for model 'm' specified "
     "max_batch_size 4"),
    (lambda c: c.set_dynamic_batching(),
     "Configuration specified scheduling_choice as 'sequence_batching', but auto-complete-config function for model "
     "'m' tries to set scheduling_choice as 'dynamic_batching'"),
    (lambda c: c.set_model_transaction_policy({"decoupled": True, "other": 1}),
     "model transaction property in auto-complete-config function for model 'm' contains property other than "
     "'decoupled'."),
    (lambda c: c.set_model_transaction_policy({"decoupled": True}),
     "trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'False'."),
])
def test_model_config_refusals(call: Any, message: str) -> None:
    config = pb_utils.ModelConfig({**BASE, "max_batch_size": 8, "sequence_batching": {},
                                   "model_transaction_policy": {"decoupled": False}})
    with pytest.raises(ValueError) as raised:
        call(config)
    assert str(raised.value) == message


def test_model_config_optional_conflict() -> None:
    config = pb_utils.ModelConfig({**BASE, "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4],
                                                      "optional": False}]})
    with pytest.raises(ValueError, match=r"^model 'm', tensor 'IN': the model expects optional True but the model "
                                         r"configuration specifies optional False$"):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})


# -- custom metrics --------------------------------------------------------------------------


def test_counter_and_gauge() -> None:
    requests = pb_utils.MetricFamily("t_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
    counter = requests.Metric(labels={"model": "m"})
    assert counter.value() == 0.0
    counter.increment(2023.0)
    assert counter.value() == 2023.0
    with pytest.raises(E, match="TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                                "non-negative values"):
        counter.increment(-1)
    with pytest.raises(E, match=r"^Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set$"):
        counter.set(1)
    with pytest.raises(E, match="does not support Observe"):
        counter.observe(0.05)
    family = pb_utils.MetricFamily(name="t_queue", description="queue depth", kind=pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric()
    gauge.increment(5)
    gauge.increment(-1.5)
    assert gauge.value() == 3.5
    gauge.set(999.9)
    assert gauge.value() == 999.9
    with pytest.raises(E):
        gauge.observe(1)


def test_histogram() -> None:
    family = pb_utils.MetricFamily("t_latency", "latency", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(E, match=r"^Failed to create metric\. Missing required buckets\.$"):
        family.Metric(labels={})
    with pytest.raises(E, match=r"^Failed to create metric\. Buckets must be a list\.$"):
        family.Metric(buckets=(1.0, 2.0))
    for bad in ([2.5, 0.1, 1.0], [1, 1, 2]):
        with pytest.raises(E, match="strictly increasing"):
            family.Metric(buckets=bad)
    family.Metric(labels={"empty": "yes"}, buckets=[])
    histogram = family.Metric(labels={"a": "b"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for sample in (0.05, 1.5, 6.0):
        histogram.observe(sample)
    series = histogram._series
    assert (series.count, series.sum, series.bucket_counts) == (3, 7.55, [1, 0, 1, 0, 1, 0])
    for operation in (histogram.value, lambda: histogram.increment(1), lambda: histogram.set(1)):
        with pytest.raises(E, match="TRITONSERVER_METRIC_KIND_HISTOGRAM does not support"):
            operation()
    with pytest.raises(E, match=r"^Failed to create metric\. Unexpected buckets found\.$"):
        pb_utils.MetricFamily("t_gauge_buckets", "g", pb_utils.MetricFamily.GAUGE).Metric(buckets=[1.0])
    with pytest.raises(E, match=r"^Failed to create metric\. Labels must be a dictionary\.$"):
        family.Metric(labels=[("a", "b")], buckets=[1.0])  # type: ignore[arg-type]


def test_metric_families_and_series_are_shared_by_name_and_labels() -> None:
    first = pb_utils.MetricFamily("t_dup", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("t_dup", "second description", pb_utils.MetricFamily.COUNTER)
    assert second._state is first._state and first._state.description == "first description"
    with pytest.raises(E, match=r"^Error when creating MetricFamily: "):
        pb_utils.MetricFamily("t_dup", "other kind", pb_utils.MetricFamily.GAUGE)
    one, two = first.Metric(labels={"k": "v"}), second.Metric(labels={"k": "v"})
    one.increment(7.5)
    assert two.value() == 7.5
    other = first.Metric(labels={"k": "w"})
    assert other.value() == 0.0


def test_metrics_of_a_deleted_family_refuse_to_work() -> None:
    family = pb_utils.MetricFamily("t_lifetime", "lifetime", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"x": "y"})
    del family
    gc.collect()
    message = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
    for operation in (lambda: metric.set(10), lambda: metric.increment(10), metric.value):
        with pytest.raises(E, match=message):
            operation()


def test_metric_changes_reach_the_runtime_hook() -> None:
    hook = MetricRuntime()
    pb_utils._set_runtime(hook)
    family = pb_utils.MetricFamily("t_hooked", "hooked", pb_utils.MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={"m": "x"}, buckets=[1.0])
    metric.observe(0.5)
    metric.observe(3.0)
    del metric
    gc.collect()
    assert [event["op"] for event in hook.events] == ["update", "update", "update", "delete"]
    last_update = hook.events[2]
    assert last_update == {"op": "update", "family": "t_hooked", "description": "hooked", "kind": "histogram",
                           "labels": {"m": "x"}, "value": 0.0, "buckets": [1.0], "bucket_counts": [1, 2],
                           "count": 2, "sum": 3.5}
    assert family._state.series == {}
