"""System shared memory over gRPC with tritonclient.grpc and tritonclient.utils.shared_memory
(SPEC §1.13): tensors in regions for unary and streamed requests, status / register / unregister,
bounds with their status codes, the --allow-client-shm switch, unregistering while in use."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from e2e.infer_models import build_repository, identity_name, sample
from e2e.infer_models import infer_server as infer_server  # the fixture: started without --allow-client-shm
from e2e.lifecycle_util import SLOW_CONFIG, slow
from e2e.repo_builder import write_model
from e2e.shm_util import Regions

pytestmark = pytest.mark.e2e

DISABLED = ("Client shared memory is disabled: start the server with --allow-client-shm=true to register or use "
            "system shared memory regions")


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_repository(tmp_path_factory.mktemp("grpc_shm_repo"))
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    with running_server(["--model-repository", str(repo), "--allow-client-shm=true"],
                        repo.parent / "grpc-shm-server.log") as server:
        yield server


@pytest.fixture
def client(shm_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    opened = grpcclient.InferenceServerClient(shm_server.grpc_url)
    yield opened
    opened.unregister_system_shared_memory()
    opened.close()


def _error(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), caught.value.message()


def assert_serves(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[4.0, 5.0]], np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(data)
    assert client.infer("id_fp32", [tensor]).as_numpy("OUTPUT0").tolist() == data.tolist()


# ------------------------------------------------------------------------------------ inference


@pytest.mark.parametrize("datatype", ["FP32", "INT8", "BOOL", "UINT64", "FP16", "BF16", "BYTES"])
def test_identity_through_shared_memory(client: Any, regions: Regions, datatype: str) -> None:
    data = sample(datatype, (2, 5))
    wire = serialize_byte_tensor(data) if datatype == "BYTES" else data.view(np.uint16) if datatype == "BF16" else data
    size = len(wire.item()) if datatype == "BYTES" else int(wire.nbytes)
    client.register_system_shared_memory("in", regions.create("in", size + 16, [wire], offset=16), size + 16)
    client.register_system_shared_memory("out", regions.create("out", size + 8), size + 8)
    tensor = grpcclient.InferInput("INPUT0", [2, 5], datatype)
    tensor.set_shared_memory("in", size, offset=16)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", size + 8)
    result = client.infer(identity_name(datatype), [tensor], outputs=[output])
    answer = result.get_response()
    # The output is listed, without data (an empty raw entry) and without parameters.
    assert [(o.name, o.datatype, list(o.shape), dict(o.parameters)) for o in answer.outputs] == [
        ("OUTPUT0", datatype, [2, 5], {})]
    assert list(answer.raw_output_contents) == [b""]
    if datatype == "BYTES":
        assert regions.contents("out", np.object_, [2, 5]).tolist() == data.tolist()
    else:
        got = regions.contents("out", wire.dtype, [2, 5])
        assert got.tolist() == wire.tolist()


def test_shared_memory_and_raw_tensors_mix(client: Any, regions: Regions) -> None:
    input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1 = np.ones((1, 16), dtype=np.int32)
    client.register_system_shared_memory("in0", regions.create("in0", 64, [input0]), 64)
    client.register_system_shared_memory("out0", regions.create("out0", 64), 64)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
              grpcclient.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(input1)]
    inputs[0].set_shared_memory("in0", 64)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out0", 64)
    result = client.infer("simple", inputs, outputs=outputs, model_version="1")
    assert regions.contents("out0", np.int32, [1, 16]).tolist() == (input0 + input1).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (input0 - input1).tolist()
    assert list(result.get_response().raw_output_contents) == [b"", (input0 - input1).tobytes()]


def test_shared_memory_on_a_stream(client: Any, regions: Regions) -> None:
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    client.register_system_shared_memory("in", regions.create("in", 32, [data]), 32)
    client.register_system_shared_memory("out", regions.create("out", 32), 32)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
        tensor.set_shared_memory("in", 32)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("out", 32)
        client.async_stream_infer("id_fp32", [tensor], outputs=[output], request_id="s")
        result, error = answers.get(timeout=30)
        assert error is None and result.get_response().id == "s"
        assert list(result.get_response().raw_output_contents) == [b""]
        assert regions.contents("out", np.float32, [1, 8]).tolist() == data.tolist()
        tensor.set_shared_memory("nope", 32)
        client.async_stream_infer("id_fp32", [tensor], request_id="bad")
        result, error = answers.get(timeout=30)
        assert result is None and error.message() == "Unable to find shared memory region: 'nope'"
    finally:
        client.stop_stream()


# ------------------------------------------------------------------------- status / unregister


def test_status_register_unregister(client: Any, regions: Regions) -> None:
    key = regions.create("a", 64)
    client.register_system_shared_memory("a", key, 32, offset=16)
    client.register_system_shared_memory("b", key, 64)
    assert client.get_system_shared_memory_status(as_json=True) == {"regions": {
        "a": {"name": "a", "key": key, "offset": "16", "byte_size": "32"},
        "b": {"name": "b", "key": key, "byte_size": "64"}}}
    assert list(client.get_system_shared_memory_status("a").regions) == ["a"]
    assert _error(lambda: client.register_system_shared_memory("a", key, 8)) == (
        "StatusCode.ALREADY_EXISTS", "shared memory region 'a' already in manager")
    client.unregister_system_shared_memory("a")
    client.unregister_system_shared_memory("never-registered")
    assert list(client.get_system_shared_memory_status().regions) == ["b"]
    assert _error(lambda: client.get_system_shared_memory_status("a")) == (
        "StatusCode.NOT_FOUND", "Unable to find system shared memory region: 'a'")
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True) == {}


def test_register_errors(client: Any, regions: Regions) -> None:
    assert _error(lambda: client.register_system_shared_memory("x", "/naiad-grpc-no-such-key", 8)) == (
        "StatusCode.INTERNAL", "Unable to open shared memory region: '/naiad-grpc-no-such-key'")
    key = regions.create("r", 64)
    for offset, byte_size in ((0, 65), (1, 64), (64, 1), (2**64 - 1, 1)):
        assert _error(lambda o=offset, b=byte_size: client.register_system_shared_memory("x", key, b, offset=o)) == (
            "StatusCode.INVALID_ARGUMENT", "failed to register shared memory region 'x': invalid args")
    assert _error(lambda: client.register_system_shared_memory("", key, 8)) == (
        "StatusCode.INVALID_ARGUMENT", "'region name' is necessary to register system shared memory region")
    assert client.get_system_shared_memory_status(as_json=True) == {}
    assert_serves(client)


@pytest.mark.parametrize(
    ("offset", "size", "status", "message"),
    [
        (64, 64, "StatusCode.INVALID_ARGUMENT", "Invalid offset for shared memory region: 'output0'"),
        (60, 64, "StatusCode.INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'output0'"),
        (0, 8, "StatusCode.INTERNAL", "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
                                      "should be at least 64 bytes to hold the results"),
    ],
)
def test_bad_shared_memory_inference(client: Any, regions: Regions, offset: int, size: int, status: str,
                                     message: str) -> None:
    client.register_system_shared_memory("input0", regions.create("input0", 64, [np.zeros(16, np.int32)]), 64)
    client.register_system_shared_memory("output0", regions.create("output0", 64), 64)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_shared_memory("input0", 64)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("output0", size, offset=offset)
    assert _error(lambda: client.infer("simple", inputs, outputs=[output])) == (status, message)
    inputs[1].set_shared_memory("input0", 128)
    assert _error(lambda: client.infer("simple", inputs)) == (
        "StatusCode.INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'input0'")
    assert_serves(client)


def test_client_shm_disabled_by_default(infer_server: ServerProcess, regions: Regions) -> None:
    with grpcclient.InferenceServerClient(infer_server.grpc_url) as client:
        key = regions.create("r", 64, [np.zeros(16, dtype=np.float32)])
        for call in (lambda: client.register_system_shared_memory("r", key, 64),
                     lambda: client.unregister_system_shared_memory()):
            assert _error(call) == ("StatusCode.UNAVAILABLE", DISABLED)
        assert client.get_system_shared_memory_status(as_json=True) == {}
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_shared_memory("r", 64)
        assert _error(lambda: client.infer("id_fp32", [tensor])) == ("StatusCode.UNAVAILABLE", DISABLED)
        assert_serves(client)


# --------------------------------------------------------------------- unregister in flight


def _slow_trips(client: Any, seconds: float) -> int:
    """Loop trips of the slow model that take about `seconds` on this machine now."""
    probe = grpcclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([1000], np.int64))
    started = time.monotonic()
    client.infer("slow", [probe])
    return max(1000, int(1000 * seconds / max(time.monotonic() - started, 1e-3)))


def test_unregister_while_a_request_runs(client: Any, regions: Regions, shm_server: ServerProcess) -> None:
    """The regions a running request uses stay until it finishes; then they are gone."""
    trips = _slow_trips(client, 1.5)
    client.register_system_shared_memory("n", regions.create("n", 8, [np.array([trips], np.int64)]), 8)
    client.register_system_shared_memory("out", regions.create("out", 4), 4)
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        with grpcclient.InferenceServerClient(shm_server.grpc_url) as slow_client:
            tensor = grpcclient.InferInput("N", [1], "INT64")
            tensor.set_shared_memory("n", 8)
            output = grpcclient.InferRequestedOutput("OUT")
            output.set_shared_memory("out", 4)
            try:
                outcome["result"] = slow_client.infer("slow", [tensor], outputs=[output], client_timeout=60)
            except Exception as error:
                outcome["error"] = error

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.5)
    client.unregister_system_shared_memory()
    assert thread.is_alive(), "the slow request finished too early to test anything"
    assert sorted(client.get_system_shared_memory_status().regions) == ["n", "out"]
    thread.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert regions.contents("out", np.float32, [1])[0] > 0
    assert client.get_system_shared_memory_status(as_json=True) == {}
    assert_serves(client)


def test_a_request_past_its_deadline_lets_go_of_its_regions(client: Any, regions: Regions) -> None:
    """A call whose deadline passes while its request computes is cancelled, and the cancelled
    request releases the regions it held: an unregister takes effect at once, not when the model
    is done."""
    trips = _slow_trips(client, 4.0)
    client.register_system_shared_memory("n", regions.create("n", 8, [np.array([trips], np.int64)]), 8)
    client.register_system_shared_memory("out", regions.create("out", 4), 4)
    tensor = grpcclient.InferInput("N", [1], "INT64")
    tensor.set_shared_memory("n", 8)
    output = grpcclient.InferRequestedOutput("OUT")
    output.set_shared_memory("out", 4)
    status, _ = _error(lambda: client.infer("slow", [tensor], outputs=[output], client_timeout=0.5))
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    started = time.monotonic()
    client.unregister_system_shared_memory()
    while client.get_system_shared_memory_status(as_json=True) and time.monotonic() - started < 2.0:
        time.sleep(0.02)
    assert client.get_system_shared_memory_status(as_json=True) == {}, "the cancelled request still holds its regions"
    _slow_trips(client, 0.0)  # queued behind the model's run to its end (it cannot be interrupted)
    assert_serves(client)
