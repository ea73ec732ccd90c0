"""The generate extension on a real server: /generate and /generate_stream with ordinary models
(identity backend, ONNX Runtime) and the decoupled repeat model, read as raw HTTP and with
aiohttp as server-sent events; every error path; clients that leave mid-request.

Errors in the middle of a stream come from a Python model written like Triton's qa mock_llm."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import aiohttp
import build_models
import pytest
from conftest import ServerProcess, running_server
from onnx import TensorProto

from e2e.infer_models import REPEAT_CONFIG
from e2e.raw_http import Answer, http, post
from e2e.repo_builder import write_model
from e2e.scaling_util import wait_pending

pytestmark = pytest.mark.e2e

SSE = "text/event-stream; charset=utf-8"
NOT_ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
           "various number of responses")

# Triton's qa mock_llm, answered by the identity backend: outputs echo inputs.
MOCK_LLM = """
backend: "identity"
max_batch_size: 0
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
        { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1, 1 ] },
         { name: "STREAM_OUT" data_type: TYPE_BOOL dims: [ 1, 1 ] } ]
"""
# The identity backend answers no OB when B is left out: a failure of the model, not of the request.
OPTIONAL = """
backend: "identity"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "B" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "OA" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "OB" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ONNX = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""
REPEAT = "repeat_int32"
# Decoupled, like Triton's qa mock_llm: REPETITION responses echoing PROMPT (request parameters
# choose how many, and whether an error follows), each with its index as a response parameter.
LLM_PY_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
        { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1, 1 ] } ]
"""
LLM_PY_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            parameters = json.loads(request.parameters())
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT")
            sender = request.get_response_sender()
            for index in range(parameters.get("REPETITION", 1)):
                text = pb_utils.Tensor("TEXT", prompt.as_numpy())
                sender.send(pb_utils.InferenceResponse([text], parameters={"index": index}))
            if parameters.get("FAIL_LAST", False):
                code = getattr(pb_utils.TritonError, parameters.get("ERROR_CODE", "INTERNAL"))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred", code)))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("generate_repo")
    write_model(repo, "mock_llm", MOCK_LLM, {1: lambda path: None})
    write_model(repo, "optional_io", OPTIONAL, {1: lambda path: None})
    write_model(repo, "onnx_int64", ONNX, {1: lambda path: build_models.identity(path, TensorProto.INT64)})
    write_model(repo, REPEAT, REPEAT_CONFIG, {1: lambda path: None})  # one instance: requests queue
    write_model(repo, "llm_py", LLM_PY_CONFIG, {1: _write_llm_py}, "model.py")
    with running_server(["--model-repository", str(repo)], repo.parent / "generate-server.log") as running:
        yield running


def _write_llm_py(path: Path) -> None:
    path.write_text(LLM_PY_MODEL)


def _post(server: ServerProcess, model: str, route: str, document: Any) -> Answer:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return post(server.url, f"/v2/models/{model}/{route}", body, {"Content-Type": "application/json"})


def _sse(answer: Answer) -> list[dict[str, Any]]:
    """The events of a complete SSE body, checking the framing of each."""
    assert answer.headers["content-type"] == SSE
    text = answer.body.decode()
    assert text == "" or text.endswith("\n\n"), text
    frames = [frame for frame in text.split("\n\n") if frame]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames), frames
    return [json.loads(frame.removeprefix("data: ")) for frame in frames]


class Events:
    """An SSE response read with aiohttp as it arrives: each event with the time it came."""

    def __init__(self, status: int, content_type: str) -> None:
        self.status = status
        self.content_type = content_type
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.ended_at = 0.0


async def _read_stream(url: str, model: str, document: Any, leave_after: int | None = None,
                       first_event: asyncio.Event | None = None) -> Events:
    """The events of one generate_stream; `first_event` is set when the first one arrives."""
    async with aiohttp.ClientSession() as session, session.post(
        f"http://{url}/v2/models/{model}/generate_stream", data=json.dumps(document),
        headers={"Accept": "text/event-stream"},
    ) as response:
        events = Events(response.status, response.headers["Content-Type"])
        while frame := await response.content.readuntil(b"\n\n"):
            assert frame.startswith(b"data: ") and frame.endswith(b"\n\n"), frame
            events.events.append((time.monotonic(), json.loads(frame[6:])))
            if first_event is not None:
                first_event.set()
            if leave_after is not None and len(events.events) == leave_after:
                return events  # closing the session drops the connection mid-stream
        events.ended_at = time.monotonic()
        return events


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    return dict(http(server.url, f"/v2/models/{model}/stats").json()["model_stats"][0])


# ------------------------------------------------------------------------------ ordinary models


def test_generate_with_an_ordinary_model(server: ServerProcess) -> None:
    answer = _post(server, "mock_llm", "generate", {"PROMPT": "hello world", "STREAM": False, "id": "q1"})
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"STREAM_OUT": False, "TEXT": "hello world", "id": "q1", "model_name": "mock_llm",
                             "model_version": "1"}


def test_generate_stream_with_an_ordinary_model_is_one_event(server: ServerProcess) -> None:
    answer = _post(server, "mock_llm", "versions/1/generate_stream", {"PROMPT": "hi", "STREAM": True})
    assert answer.status == 200 and answer.headers["transfer-encoding"] == "chunked"
    assert _sse(answer) == [{"STREAM_OUT": True, "TEXT": "hi", "model_name": "mock_llm", "model_version": "1"}]


def test_onnx_model_with_a_batch_dimension(server: ServerProcess) -> None:
    # INPUT0 is [-1, -1] to clients: a list fills the inner dim, a scalar is [1, 1].
    assert _post(server, "onnx_int64", "generate", {"INPUT0": [1, -2, 3]}).json()["OUTPUT0"] == [1, -2, 3]
    assert _post(server, "onnx_int64", "generate", {"INPUT0": 9}).json()["OUTPUT0"] == 9
    events = _sse(_post(server, "onnx_int64", "generate_stream", {"INPUT0": [4, 5]}))
    assert [e["OUTPUT0"] for e in events] == [[4, 5]]


# ------------------------------------------------------------------------------ decoupled model


def test_decoupled_events_arrive_as_the_model_sends_them(server: ServerProcess) -> None:
    document = {"IN": [10, 20, 30], "DELAY": [0, 500, 500], "id": "s1"}
    events = asyncio.run(_read_stream(server.url, REPEAT, document))
    assert events.status == 200 and events.content_type == SSE
    assert [(e["OUT"], e["IDX"], e["id"]) for _, e in events.events] == [(10, 0, "s1"), (20, 1, "s1"), (30, 2, "s1")]
    times = [t for t, _ in events.events]
    # The first event was read while the model still slept before the others: not buffered.
    assert times[2] - times[0] > 0.6 and events.ended_at - times[0] > 0.6


def test_decoupled_model_through_generate_needs_exactly_one_response(server: ServerProcess) -> None:
    one = _post(server, REPEAT, "generate", {"IN": 5})
    assert one.status == 200 and one.json() == {"IDX": 0, "OUT": 5, "model_name": REPEAT, "model_version": "1"}
    for values in ([1, 2], []):
        answer = _post(server, REPEAT, "generate", {"IN": values})
        assert answer.status == 500 and answer.error() == NOT_ONE
    # The same requests stream fine: two events, or none (the flags-only final sends nothing).
    assert len(_sse(_post(server, REPEAT, "generate_stream", {"IN": [1, 2]}))) == 2
    empty = _post(server, REPEAT, "generate_stream", {"IN": []})
    assert empty.status == 200 and _sse(empty) == []


# ------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_unknown_model(server: ServerProcess, route: str) -> None:
    answer = _post(server, "nope", route, {"PROMPT": "x"})
    assert answer.status == 404 and answer.error() == "Request for unknown model: 'nope' is not found"


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("body", [b'{"PROMPT": "x"', b"", b"not json"])
def test_malformed_json(server: ServerProcess, route: str, body: bytes) -> None:
    answer = _post(server, "mock_llm", route, body)
    assert answer.status == 400 and answer.error().startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("document", "got"), [({}, 0), ({"abc": 123}, 0), ({"STREAM": False, "x": "y"}, 1)])
def test_missing_inputs(server: ServerProcess, route: str, document: dict[str, Any], got: int) -> None:
    answer = _post(server, "mock_llm", route, document)
    assert answer.status == 400
    assert answer.error().startswith(f"[request id: <id_unknown>] expected 2 inputs but got {got} inputs for "
                                     "model 'mock_llm'")
    optional = _post(server, "optional_io", route, {"id": "r9"})
    assert optional.error().startswith("[request id: r9] expected number of inputs between 1 and 2 but got 0 "
                                       "inputs for model 'optional_io'")


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("document", "message"), [
    ({"PROMPT": 123, "STREAM": False}, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ({"PROMPT": "x", "STREAM": "false"}, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ({"PROMPT": "x", "STREAM": False, "p": {"a": 1}},
     "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"PROMPT": "x", "STREAM": false, "PROMPT": "y"}', "input 'PROMPT' already exists in request"),
])
def test_wrong_types(server: ServerProcess, route: str, document: Any, message: str) -> None:
    answer = _post(server, "mock_llm", route, document)
    assert answer.status == 400 and answer.error() == message


def test_model_failure_as_first_response(server: ServerProcess) -> None:
    # /generate: a plain JSON error; /generate_stream: the status comes from the first response,
    # and the error is its event.
    message = "output 'OB' was not produced by model 'optional_io'"
    answer = _post(server, "optional_io", "generate", {"A": 1})
    assert answer.status == 500 and answer.error() == message
    streamed = _post(server, "optional_io", "generate_stream", {"A": 1})
    assert streamed.status == 500 and _sse(streamed) == [{"error": message}]
    refused = _post(server, REPEAT, "generate_stream", {"IN": [1, 2], "DELAY": [1]})
    assert refused.status == 400 and _sse(refused) == [{"error": "DELAY must have as many elements as IN"}]


def test_an_error_mid_stream_is_an_event_and_the_status_stays_200(server: ServerProcess) -> None:
    document = {"PROMPT": "hello", "STREAM": True, "parameters": {"REPETITION": 2, "FAIL_LAST": True}}
    answer = _post(server, "llm_py", "generate_stream", document)
    assert answer.status == 200
    assert _sse(answer) == [
        {"TEXT": "hello", "index": 0, "model_name": "llm_py", "model_version": "1"},
        {"TEXT": "hello", "index": 1, "model_name": "llm_py", "model_version": "1"},
        {"error": "An Error Occurred"},
    ]


@pytest.mark.parametrize(("code", "status"), [("INTERNAL", 500), ("UNAVAILABLE", 503)])
@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_model_error_as_first_response_sets_the_status(server: ServerProcess, route: str, code: str,
                                                         status: int) -> None:
    document = {"PROMPT": "x", "STREAM": True, "REPETITION": 0, "FAIL_LAST": True, "ERROR_CODE": code}
    answer = _post(server, "llm_py", route, document)
    assert answer.status == status
    errors = _sse(answer) if route == "generate_stream" else [answer.json()]
    assert errors == [{"error": "An Error Occurred"}]


def test_one_response_then_a_flags_only_final_is_one_answer(server: ServerProcess) -> None:
    answer = _post(server, "llm_py", "generate", {"PROMPT": "once", "STREAM": False, "id": "g"})
    assert answer.json() == {"TEXT": "once", "id": "g", "index": 0, "model_name": "llm_py", "model_version": "1"}


def test_wrong_method(server: ServerProcess) -> None:
    assert http(server.url, "/v2/models/mock_llm/generate_stream").status == 405


# ----------------------------------------------------------------------------- clients leaving


def test_a_client_that_leaves_takes_its_queued_request_out_of_the_queue(server: ServerProcess) -> None:
    before = _stats(server, REPEAT)
    body = json.dumps({"IN": [7]}).encode()
    request = (b"POST /v2/models/%s/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
               % (REPEAT.encode(), len(body), body))
    host, port = server.url.rsplit(":", 1)

    async def main() -> Events:
        # The first stream holds the only instance for 1.5 s (its first event says it runs); the
        # second waits behind it, and its client leaves.
        first = asyncio.Event()
        running = asyncio.create_task(
            _read_stream(server.url, REPEAT, {"IN": [1, 2], "DELAY": [0, 1500]}, first_event=first))
        await asyncio.wait_for(first.wait(), 30)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(request)
            await asyncio.to_thread(wait_pending, server.metrics_port, REPEAT, 1)  # queued behind it
        return await running

    events = asyncio.run(main())
    assert [e["OUT"] for _, e in events.events] == [1, 2]
    assert _post(server, REPEAT, "generate", {"IN": 3}).json()["OUT"] == 3  # queued after the abandoned one
    after = _stats(server, REPEAT)
    assert after["execution_count"] - before["execution_count"] == 2  # the abandoned request never ran
    fail = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert fail == 1


def test_a_client_that_leaves_mid_stream_leaves_the_server_serving(server: ServerProcess) -> None:
    events = asyncio.run(_read_stream(server.url, REPEAT, {"IN": [1, 2, 3], "DELAY": [0, 300, 300]}, leave_after=1))
    assert [e["OUT"] for _, e in events.events] == [1]
    assert _sse(_post(server, REPEAT, "generate_stream", {"IN": [4, 5]})) == [
        {"IDX": 0, "OUT": 4, "model_name": REPEAT, "model_version": "1"},
        {"IDX": 1, "OUT": 5, "model_name": REPEAT, "model_version": "1"},
    ]
    assert _post(server, "mock_llm", "generate", {"PROMPT": "still", "STREAM": True}).json()["TEXT"] == "still"


def test_keep_alive_across_streams(server: ServerProcess) -> None:
    host, port = server.url.rsplit(":", 1)
    connection = HTTPConnection(host, int(port), timeout=10)
    try:
        outs, sockets = [], []
        for values in ([1], [2, 3], []):
            connection.request("POST", f"/v2/models/{REPEAT}/generate_stream", body=json.dumps({"IN": values}))
            response = connection.getresponse()
            assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
            text = response.read().decode()  # http.client undoes the chunked framing
            outs.append([json.loads(frame[6:])["OUT"] for frame in text.split("\n\n") if frame])
            sockets.append(connection.sock)
        assert outs == [[1], [2, 3], []]
        assert sockets[0] is not None and sockets.count(sockets[0]) == 3  # one connection throughout
    finally:
        connection.close()
