"""pb_utils (naiad's triton_python_backend_utils) against a fake runtime: requests, responses,
senders and BLS, with the messages model.py files see under Triton."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import numpy as np
import pytest
from backends.python.pb_fakes import FakeRuntime

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


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
