"""Triton-style model.py files (tests/e2e/python_models) served by a real naiad through tritonclient
over HTTP and gRPC: tensors in and out, BYTES, decoupled streaming, BLS, errors from model code, a
model process killed mid-request, auto-complete, the initialize args, async execute, cancellation."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess, free_ports, running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

PYTHON_MODELS = Path(__file__).parent / "python_models"
WAIT = 30  # seconds: a bound on every wait, never reached when things work
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(PYTHON_MODELS), "--model-repository", str(example_repo),
            "--exit-on-error=false", "--strict-readiness=false"]
    scratch = tmp_path_factory.mktemp("python")
    os.environ["NAIAD_TEST_TMP"] = str(scratch)  # inherited by the server and its model processes
    try:
        with running_server(args, scratch / "naiad.log") as running:
            yield running
    finally:
        del os.environ["NAIAD_TEST_TMP"]


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def tensor(protocol: str, name: str, array: np.ndarray, datatype: str) -> Any:
    made = CLIENTS[protocol].InferInput(name, list(array.shape), datatype)
    made.set_data_from_numpy(array)
    return made


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub(server: ServerProcess, protocol: str) -> None:
    a = np.array([1.5, 2, 3, 4], dtype=np.float32)
    b = np.array([0.5, 1, -1, 10], dtype=np.float32)
    result = client(server, protocol).infer(
        "add_sub", [tensor(protocol, "INPUT0", a, "FP32"), tensor(protocol, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_in_and_out_with_response_parameters(server: ServerProcess, protocol: str) -> None:
    text = np.array([["héllo wörld".encode(), b"", b"abc"]], dtype=np.object_)
    result = client(server, protocol).infer("bytes_upper", [tensor(protocol, "TEXT", text, "BYTES")])
    assert result.as_numpy("UPPER").tolist() == [["HÉLLO WÖRLD".encode(), b"", b"ABC"]]
    assert result.as_numpy("LENGTH").tolist() == [[11, 0, 3]]
    response = result.get_response()
    if protocol == "http":
        assert response["parameters"] == {"batch_requests": 1}
    else:
        assert response.parameters["batch_requests"].int64_param == 1


def test_many_concurrent_requests_all_answered_correctly(server: ServerProcess) -> None:
    """Two instances, many requests in flight: each answer belongs to its own request."""
    http = httpclient.InferenceServerClient(server.url, concurrency=16)
    pending = []
    for i in range(64):
        a = np.full(4, i, dtype=np.float32)
        b = np.arange(4, dtype=np.float32)
        pending.append((i, http.async_infer("add_sub", [tensor("http", "INPUT0", a, "FP32"),
                                                        tensor("http", "INPUT1", b, "FP32")])))
    for i, call in pending:
        np.testing.assert_array_equal(call.get_result().as_numpy("OUTPUT0"), i + np.arange(4, dtype=np.float32))


_LARGE_ECHO_CONFIG = """
name: "large_echo"
backend: "python"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "C" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "D" data_type: TYPE_FP32 dims: [ 3072 ] }
]
output [
  { name: "A" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "C" data_type: TYPE_FP32 dims: [ 4096 ] },
  { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 4096 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_LARGE_ECHO_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)  # slow enough for the server to queue several requests for it
        responses = []
        for request in requests:
            a, b, c = (pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in "ABC")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("A", a), pb_utils.Tensor("B", b),
                                                         pb_utils.Tensor("C", c), pb_utils.Tensor("TWICE_A", 2 * a)]))
        return responses
"""


def test_large_requests_and_answers_in_flight_never_stop_the_server(tmp_path: Path) -> None:
    """60 kB requests and 64 kB answers, 16 at a time, to a model that takes 50 ms: the server
    queues more for the model process than the socket holds, while the model's answers fill the
    other direction. Before, the event loop waited for the model to read while the model waited
    for the loop to read its answer: every client of every model stopped being served."""
    model = tmp_path / "repo" / "large_echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_LARGE_ECHO_CONFIG)
    (model / "1" / "model.py").write_text(_LARGE_ECHO_MODEL)
    answered: list[int] = []
    failures: list[str] = []

    def send(index: int) -> None:
        http = httpclient.InferenceServerClient(server.url, network_timeout=WAIT)
        for round_ in range(3):
            arrays = {name: np.full(3072 if name == "D" else 4096, index * 10 + round_, dtype=np.float32)
                      for name in "ABCD"}
            try:
                result = http.infer("large_echo", [tensor("http", name, array, "FP32")
                                                   for name, array in arrays.items()])
            except Exception as error:
                failures.append(str(error))
                return
            for name in "ABC":
                np.testing.assert_array_equal(result.as_numpy(name), arrays[name])
            np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * arrays["A"])
            answered.append(index)

    with running_server(["--model-repository", str(tmp_path / "repo")], tmp_path / "naiad.log") as server:
        senders = [threading.Thread(target=send, args=(i,)) for i in range(16)]
        for sender in senders:
            sender.start()
        health: list[float] = []  # another client's health checks while the requests run
        while any(sender.is_alive() for sender in senders) and not failures:
            began = time.monotonic()
            try:
                status = server.get("/v2/health/live")
            except OSError as error:
                failures.append(f"health check: {error}")
                break
            health.append(time.monotonic() - began)
            assert status == 200
            time.sleep(0.05)
        for sender in senders:
            sender.join(WAIT)
    assert not failures, failures[:3]
    assert len(answered) == 48
    assert max(health) < 1.0, f"a health check waited {max(health):.2f} s"


def _stream_answers(server: ServerProcess, model: str, inputs: list[Any], count: int,
                    request_id: str = "r") -> list[tuple[Any, float]]:
    answers: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.start_stream(callback=lambda result, error: answers.put((result, error, time.monotonic())))
    try:
        grpc.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        got = []
        for _ in range(count):
            result, error, at = answers.get(timeout=WAIT)
            assert error is None, error
            got.append((result, at))
        return got
    finally:
        grpc.stop_stream()
        grpc.close()


def test_decoupled_model_streams_each_response_as_it_is_sent(server: ServerProcess) -> None:
    values = np.array([10, 20, 30], dtype=np.int32)
    delays = np.array([0, 1000, 1000], dtype=np.uint32)  # 1 s apart: far beyond a delivery's jitter
    inputs = [tensor("grpc", "IN", values, "INT32"), tensor("grpc", "DELAY", delays, "UINT32")]
    answers = _stream_answers(server, "repeat_py", inputs, 4)
    outputs = [(int(r.as_numpy("OUT")[0]), int(r.as_numpy("IDX")[0])) for r, _ in answers[:3]]
    assert outputs == [(10, 0), (20, 1), (30, 2)]
    final = answers[3][0].get_response()
    assert final.parameters["triton_final_response"].bool_param and not final.outputs
    # the first response arrived while the model was still sleeping before the second
    assert answers[1][1] - answers[0][1] > 0.2


def test_decoupled_model_refused_on_unary_endpoints(server: ServerProcess) -> None:
    values = np.array([1], dtype=np.int32)
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        httpclient.InferenceServerClient(server.url).infer("repeat_py", [tensor("http", "IN", values, "INT32")])
    with pytest.raises(InferenceServerException, match="decoupled"):
        grpcclient.InferenceServerClient(server.grpc_url).infer("repeat_py", [tensor("grpc", "IN", values, "INT32")])


def _bls(server: ServerProcess, target: str, protocol: str = "http") -> Any:
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.full(16, 2, dtype=np.int32)
    inputs = [tensor(protocol, "INPUT0", in0, "INT32"), tensor(protocol, "INPUT1", in1, "INT32"),
              tensor(protocol, "TARGET", np.array([target.encode()], dtype=np.object_), "BYTES")]
    return client(server, protocol).infer("bls", inputs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_calls_an_onnx_model(server: ServerProcess, protocol: str) -> None:
    result = _bls(server, "simple", protocol)
    # "simple" version 2 (the latest) answers OUTPUT0 = INPUT0 - INPUT1
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(16, dtype=np.int32) - 2)


def test_a_bls_call_given_the_request_trace_joins_it(server: ServerProcess, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    with httpclient.InferenceServerClient(server.url) as http:
        http.update_trace_settings(settings={"trace_file": str(trace_file), "log_frequency": "1"})
        http.update_trace_settings("bls", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        try:
            _bls(server, "simple")
        finally:
            http.update_trace_settings("bls", {"trace_level": None, "trace_rate": None})
    deadline = time.monotonic() + WAIT
    traces: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:  # one file per trace; the caller's is written once its reply is out
        for path in tmp_path.glob("trace.json.*"):
            for item in json.loads(path.read_text()):
                traces.setdefault(item["id"], {}).update(item)
        if {t.get("model_name") for t in traces.values()} >= {"bls", "simple"}:
            break
        time.sleep(0.05)
    (parent,) = [t for t in traces.values() if t.get("model_name") == "bls"]
    (child,) = [t for t in traces.values() if t.get("model_name") == "simple"]
    assert parent["parent_id"] == 0 and child["parent_id"] == parent["id"]


def test_bls_streams_from_a_decoupled_model(server: ServerProcess) -> None:
    result = _bls(server, "repeat_py")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(16, dtype=np.int32))
    assert result.as_numpy("COUNT").tolist() == [16]


def test_bls_error_reaches_the_caller(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'no_such_model' is not found"):
        _bls(server, "no_such_model")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_with_the_model_name_as_bytes_from_a_string_tensor(server: ServerProcess, protocol: str) -> None:
    """Triton's examples/bls/sync_model.py: `model_name=` is the bytes element of a BYTES input."""
    a = np.array([1.5, 2, 3, 4], dtype=np.float32)
    b = np.array([0.5, 1, -1, 10], dtype=np.float32)
    inputs = [tensor(protocol, "MODEL_NAME", np.array([b"add_sub"], dtype=np.object_), "BYTES"),
              tensor(protocol, "INPUT0", a, "FP32"), tensor(protocol, "INPUT1", b, "FP32")]
    result = client(server, protocol).infer("bls_sync", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_errors_from_model_code(server: ServerProcess, protocol: str) -> None:
    raises = client(server, protocol)

    def call(value: int) -> Any:
        return raises.infer("raises", [tensor(protocol, "IN", np.array([value], dtype=np.int32), "INT32")])

    assert call(5).as_numpy("OUT").tolist() == [5]
    with pytest.raises(InferenceServerException, match="IN must not be negative") as bad:
        call(-1)
    assert bad.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException, match="execute raised on purpose") as raised:
        call(999)
    assert raised.value.status() in ("500", "StatusCode.INTERNAL")
    assert call(6).as_numpy("OUT").tolist() == [6]  # the model process is still serving


def test_killed_model_process_fails_only_its_request_and_is_replaced(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def call(value: int) -> Any:
        return http.infer("crash", [tensor("http", "IN", np.array([value], dtype=np.int32), "INT32")])

    before = int(call(0).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException, match="Stub process 'crash_0' is not healthy"):
        call(1)
    after = call(7)  # waits for the new process if it is still starting
    assert after.as_numpy("OUT").tolist() == [7]
    assert int(after.as_numpy("PID")[0]) != before
    assert http.is_model_ready("crash")
    # other models never noticed
    assert _bls(server, "simple").as_numpy("OUTPUT0")[0] == -2


def test_requests_fail_fast_when_the_model_process_cannot_be_restarted(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def call(value: int) -> Any:
        return http.infer("crash_then_fail", [tensor("http", "IN", np.array([value], dtype=np.int32), "INT32")])

    assert call(0).as_numpy("OUT").tolist() == [0]
    with pytest.raises(InferenceServerException, match="Stub process 'crash_then_fail_0' is not healthy"):
        call(1)
    started = time.monotonic()
    for _ in range(3):  # no process will come: each fails at once instead of waiting for one
        with pytest.raises(InferenceServerException, match="is not healthy"):
            call(0)
    assert time.monotonic() - started < 10
    assert call_other_model_works(server)


def call_other_model_works(server: ServerProcess) -> bool:
    a = np.ones(4, dtype=np.float32)
    result = httpclient.InferenceServerClient(server.url).infer(
        "add_sub", [tensor("http", "INPUT0", a, "FP32"), tensor("http", "INPUT1", a, "FP32")])
    return bool((result.as_numpy("OUTPUT0") == 2).all())


def test_model_ready_asks_the_model_s_is_ready(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def settle(expected: bool) -> bool:
        deadline = time.monotonic() + WAIT  # the server asks again at most once a second
        while time.monotonic() < deadline:
            if http.is_model_ready("readiness") == expected and grpc.is_model_ready("readiness") == expected:
                return True
            time.sleep(0.1)
        return False

    assert settle(True)
    http.infer("readiness", [tensor("http", "IN", np.array([0], dtype=np.int32), "INT32")])
    assert settle(False)
    http.infer("readiness", [tensor("http", "IN", np.array([1], dtype=np.int32), "INT32")])
    assert settle(True)


def test_auto_complete_config_fills_the_config(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    config = http.get_model_config("auto_complete")
    assert config["max_batch_size"] == 4
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("X", "TYPE_FP32", [2])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("Y", "TYPE_FP32", [2])]
    assert "dynamic_batching" in config
    x = np.array([[1, 2], [3, 4]], dtype=np.float32)
    np.testing.assert_array_equal(http.infer("auto_complete", [tensor("http", "X", x, "FP32")]).as_numpy("Y"), 2 * x)


def test_initialize_gets_triton_s_seven_args(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    result = http.infer("init_args", [tensor("http", "IN", np.array([0], dtype=np.int32), "INT32")])
    args = json.loads(result.as_numpy("ARGS")[0])
    assert sorted(args) == sorted(["model_config", "model_instance_kind", "model_instance_name",
                                   "model_instance_device_id", "model_repository", "model_version", "model_name"])
    assert all(isinstance(v, str) for v in args.values())
    assert (args["model_name"], args["model_version"], args["model_instance_kind"]) == ("init_args", "1", "CPU")
    assert args["model_instance_name"] == "init_args_0"
    assert args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]).resolve() == (PYTHON_MODELS / "init_args").resolve()
    config = json.loads(args["model_config"])
    assert config["name"] == "init_args"
    assert config["parameters"] == {"greeting": {"string_value": "hello"}}


def test_async_execute_awaits_bls(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    result = grpc.infer("async_add", [tensor("grpc", "INPUT0", in0, "INT32"), tensor("grpc", "INPUT1", in1, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 - in1)


def test_cancelled_stream_is_seen_by_is_cancelled(server: ServerProcess) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    grpc.async_stream_infer("cancellable", [tensor("grpc", "IN", np.array([0], dtype=np.int32), "INT32")])
    for expected in (1, 2, 3):
        result, error = answers.get(timeout=WAIT)
        assert error is None and int(result.as_numpy("OUT")[0]) == expected
    grpc.stop_stream(cancel_requests=True)
    grpc.close()
    ask = [tensor("grpc", "IN", np.array([1], dtype=np.int32), "INT32")]
    deadline = time.monotonic() + WAIT
    while True:  # the model notices at its next check (every 20 ms)
        ((answer, _),) = _stream_answers(server, "cancellable", ask, 1)
        if int(answer.as_numpy("OUT")[0]) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert int(answer.as_numpy("OUT")[0]) == 1


def test_initialize_failure_makes_the_model_unavailable_with_its_message(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    assert index["bad_init"]["state"] == "UNAVAILABLE"
    assert index["bad_init"]["reason"] == "bad_init cannot start: missing weights"
    assert not http.is_model_ready("bad_init")


def test_statistics_count_python_model_executions(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    before = http.get_inference_statistics("raises")["model_stats"][0]["inference_stats"]["success"]["count"]
    http.infer("raises", [tensor("http", "IN", np.array([1], dtype=np.int32), "INT32")])
    stats = http.get_inference_statistics("raises")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == before + 1
    assert stats["execution_count"] >= 1


ENV_MODEL_PY = '''\
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("env_model initialized")

    def execute(self, requests):
        marker = os.environ.get("NAIAD_PACKED_ENV", "").encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ENV", np.array([marker], dtype=np.object_))])
                for _ in requests]
'''


def test_execution_env_path_runs_the_model_in_its_packed_environment(start_server: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.python.test_environment import pack_env

    model = tmp_path / "repo" / "env_model"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(ENV_MODEL_PY)
    pack_env(model / "env.tar.gz", "from-the-tarball")
    (model / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "ENV" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))  # inherited by the server
    server = start_server(["--model-repository", str(tmp_path / "repo")])
    http = httpclient.InferenceServerClient(server.url)
    result = http.infer("env_model", [tensor("http", "IN", np.array([0], dtype=np.int32), "INT32")])
    assert result.as_numpy("ENV").tolist() == [b"from-the-tarball"]
    assert "env_model initialized" in server.logs()  # pb_utils.Logger lines reach the server's log


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(child) for child in text)
    return found


def test_a_signal_to_the_server_s_process_group_finalizes_every_model_process(tmp_path: Path) -> None:
    """Ctrl-C in a terminal (or `kill -- -PGID`) signals the whole process group: the model
    processes must not die with it, but be finalized by the server as it unloads them."""
    http_port, grpc_port, metrics_port = free_ports(3)
    log_path = tmp_path / "naiad.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(PYTHON_MODELS),
             "--exit-on-error=false", "--strict-readiness=false", "--http-address", "127.0.0.1",
             f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        deadline = time.monotonic() + WAIT
        while not _ready(http) and time.monotonic() < deadline:
            time.sleep(0.1)
        a = np.ones(4, dtype=np.float32)
        http.infer("add_sub", [tensor("http", "INPUT0", a, "FP32"), tensor("http", "INPUT1", a, "FP32")])
        stubs = _children(process.pid)
        assert len(stubs) >= 2  # add_sub alone has two instances
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(WAIT) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    logs = log_path.read_text()
    assert logs.count("add_sub finalized") == 2
    assert "starting a new one" not in logs
    assert not [pid for pid in stubs if Path(f"/proc/{pid}").exists()
                and "zombie" not in Path(f"/proc/{pid}/status").read_text()]


def _ready(http: Any) -> bool:
    try:
        return bool(http.is_server_ready())
    except Exception:
        return False
