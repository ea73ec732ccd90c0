"""System shared memory over HTTP with tritonclient.http and tritonclient.utils.shared_memory
(SPEC §1.13): tensors in regions, status and unregister, bounds, the --allow-client-shm switch,
and unregistering regions that requests still use."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from e2e.infer_models import assert_serves, build_repository, identity_name, sample
from e2e.infer_models import infer_server as infer_server  # the fixture: started without --allow-client-shm
from e2e.lifecycle_util import SLOW_CONFIG, slow
from e2e.raw_http import http, post_json
from e2e.repo_builder import write_model
from e2e.shm_util import Regions

pytestmark = pytest.mark.e2e

DISABLED = ("Client shared memory is disabled: start the server with --allow-client-shm=true to register or use "
            "system shared memory regions")


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that allows client shared memory, on the inference repository plus a slow model."""
    repo = build_repository(tmp_path_factory.mktemp("shm_repo"))
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    with running_server(["--model-repository", str(repo), "--allow-client-shm=true"],
                        repo.parent / "shm-server.log") as server:
        yield server


@pytest.fixture
def client(shm_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(shm_server.url, network_timeout=60)
    yield client
    client.unregister_system_shared_memory()
    client.close()


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _wire(datatype: str, data: np.ndarray) -> np.ndarray:
    """What set_shared_memory_region should write for `data`: BYTES serialized, BF16 as its bits."""
    if datatype == "BYTES":
        return serialize_byte_tensor(data)
    return data.view(np.uint16) if datatype == "BF16" else data


# ------------------------------------------------------------------------------------ inference


@pytest.mark.parametrize("datatype", ["FP32", "INT8", "BOOL", "UINT64", "FP16", "BF16", "BYTES"])
def test_identity_through_shared_memory(client: Any, regions: Regions, datatype: str) -> None:
    data = sample(datatype, (2, 5))
    wire = _wire(datatype, data)
    size = int(wire.nbytes) if datatype != "BYTES" else len(wire.item())
    in_key = regions.create("in", size + 16, [wire], offset=16)
    out_key = regions.create("out", size + 8)
    client.register_system_shared_memory("in", in_key, size + 16)
    client.register_system_shared_memory("out", out_key, size + 8)

    tensor = httpclient.InferInput("INPUT0", [2, 5], datatype).set_shared_memory("in", size, offset=16)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", size + 8)
    result = client.infer(identity_name(datatype), [tensor], outputs=[output])

    # No data and no parameters on an output written to shared memory (SPEC §0).
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": datatype, "shape": [2, 5]}
    if datatype == "BYTES":
        assert regions.contents("out", np.object_, [2, 5]).tolist() == data.tolist()
    elif datatype == "BF16":
        got = regions.contents("out", np.uint16, [2, 5])
        assert got.tolist() == data.astype(ml_dtypes.bfloat16).view(np.uint16).tolist()
    else:
        assert regions.contents("out", data.dtype, [2, 5]).tolist() == data.tolist()


def test_shared_memory_and_plain_tensors_mix(client: Any, regions: Regions) -> None:
    """Triton's QA test_mixed_raw_shm: INPUT0 in a region, INPUT1 binary, OUTPUT0 to a region,
    OUTPUT1 as JSON."""
    input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1 = np.ones((1, 16), dtype=np.int32)
    client.register_system_shared_memory("in0", regions.create("in0", 64, [input0]), 64)
    client.register_system_shared_memory("out0", regions.create("out0", 64), 64)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32").set_shared_memory("in0", 64),
              httpclient.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(input1, binary_data=True)]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    outputs[0].set_shared_memory("out0", 64)
    result = client.infer("simple", inputs, outputs=outputs, model_version="1")
    assert regions.contents("out0", np.int32, [1, 16]).tolist() == (input0 + input1).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (input0 - input1).tolist()
    assert "parameters" not in result.get_output("OUTPUT1")


def test_strings_through_shared_memory(client: Any, regions: Regions) -> None:
    values = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    serialized = serialize_byte_tensor(values)
    size = len(serialized.item())
    for name in ("in0", "in1"):
        client.register_system_shared_memory(name, regions.create(name, size, [serialized]), size)
    client.register_system_shared_memory("out", regions.create("out", 1024), 1024)
    inputs = [httpclient.InferInput(n, [1, 16], "BYTES").set_shared_memory(r, size)
              for n, r in (("INPUT0", "in0"), ("INPUT1", "in1"))]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", 1024)
    result = client.infer("simple_string", inputs, outputs=outputs)
    sums = regions.contents("out", np.object_, [1, 16])
    assert [int(s) for s in sums.flat] == [2 * i for i in range(16)]
    assert result.as_numpy("OUTPUT1").tolist() == [[b"0"] * 16]


# ------------------------------------------------------------------------- status / unregister


def test_status_register_unregister(client: Any, regions: Regions) -> None:
    key = regions.create("a", 64)
    client.register_system_shared_memory("a", key, 32, offset=16)
    client.register_system_shared_memory("b", key, 64)
    assert client.get_system_shared_memory_status() == [
        {"name": "a", "key": key, "offset": 16, "byte_size": 32},
        {"name": "b", "key": key, "offset": 0, "byte_size": 64},
    ]
    assert client.get_system_shared_memory_status("a") == [{"name": "a", "key": key, "offset": 16, "byte_size": 32}]
    error = _error(lambda: client.register_system_shared_memory("a", key, 8))
    assert (error.status(), error.message()) == ("400", "shared memory region 'a' already in manager")
    client.unregister_system_shared_memory("a")
    client.unregister_system_shared_memory("never-registered")  # not an error, as in Triton
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["b"]
    error = _error(lambda: client.get_system_shared_memory_status("a"))
    assert (error.status(), error.message()) == ("404", "Unable to find system shared memory region: 'a'")
    client.register_system_shared_memory("a", key, 8)
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_register_errors(client: Any, regions: Regions, shm_server: ServerProcess) -> None:
    error = _error(lambda: client.register_system_shared_memory("x", "/naiad-e2e-no-such-key", 8))
    assert (error.status(), error.message()) == ("500", "Unable to open shared memory region: '/naiad-e2e-no-such-key'")
    key = regions.create("r", 64)
    for offset, byte_size in ((0, 65), (1, 64), (64, 1), (65, 0)):
        error = _error(lambda o=offset, b=byte_size: client.register_system_shared_memory("x", key, b, offset=o))
        assert (error.status(), error.message()) == ("400", "failed to register shared memory region 'x': invalid args")
    answer = post_json(shm_server.url, "/v2/systemsharedmemory/region/x/register", {"key": key, "offset": -1,
                                                                                    "byte_size": 8})
    assert (answer.status, answer.error()) == (500, "attempt to access JSON non-unsigned-integer as unsigned-integer")
    answer = post_json(shm_server.url, "/v2/systemsharedmemory/region/x/register", {"key": key})
    assert (answer.status, answer.error()) == (400, "Shared memory register request has no 'byte_size' field")
    answer = post_json(shm_server.url, "/v2/systemsharedmemory/register", {"key": key, "byte_size": 8})
    assert (answer.status, answer.error()) == (
        400, "'region name' is necessary to register system shared memory region")
    assert http(shm_server.url, "/v2/systemsharedmemory/status", "POST").status == 405
    assert http(shm_server.url, "/v2/systemsharedmemory/unregister").status == 405
    assert client.get_system_shared_memory_status() == []
    assert_serves(shm_server.url)


# ------------------------------------------------------------------------------ bad inference


def _simple_in_shm(client: Any, regions: Regions) -> None:
    """Four 64-byte regions as Triton's QA sets them up for `simple`."""
    client.register_system_shared_memory("input0", regions.create("input0", 64, [np.arange(16, dtype=np.int32)]), 64)
    client.register_system_shared_memory("input1", regions.create("input1", 64, [np.ones(16, dtype=np.int32)]), 64)
    for name in ("output0", "output1"):
        client.register_system_shared_memory(name, regions.create(name, 64), 64)


def _simple_request(client: Any, input1: tuple[str, int] = ("input1", 64), output: tuple[int, int] = (0, 64),
                    output_size: int = 64) -> Any:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32").set_shared_memory("input0", 64),
              httpclient.InferInput("INPUT1", [1, 16], "INT32").set_shared_memory(*input1)]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0", output[1], offset=output[0])
    outputs[1].set_shared_memory("output1", output_size)
    return client.infer("simple", inputs, outputs=outputs, model_version="1")


@pytest.mark.parametrize(
    ("kwargs", "status", "message"),
    [
        ({"output": (2**64 - 32, 64)}, "400", "Invalid offset for shared memory region: 'output0'"),
        ({"output": (64, 64)}, "400", "Invalid offset for shared memory region: 'output0'"),
        ({"output": (60, 64)}, "400", "Invalid offset + byte size for shared memory region: 'output0'"),
        ({"output": (32, 2**64 - 32)}, "400",
         "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds maximum value "
         "(18446744073709551615) for region 'output0'"),
        ({"input1": ("big", 128)}, "400",
         "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, "
         "got 128"),
        ({"input1": ("nope", 64)}, "404", "Unable to find shared memory region: 'nope'"),
        ({"output_size": 8}, "500", "shared memory size specified with the request for output 'OUTPUT1' (8 bytes) "
                                    "should be at least 64 bytes to hold the results"),
    ],
)
def test_bad_shared_memory_inference(client: Any, regions: Regions, shm_server: ServerProcess,
                                     kwargs: dict[str, Any], status: str, message: str) -> None:
    _simple_in_shm(client, regions)
    client.register_system_shared_memory("big", regions.create("big", 128), 128)
    error = _error(lambda: _simple_request(client, **kwargs))
    assert (error.status(), error.message()) == (status, message)
    assert len(client.get_system_shared_memory_status()) == 5
    assert_serves(shm_server.url)
    _simple_request(client)  # the same regions still work
    assert regions.contents("output0", np.int32, [16]).tolist() == list(range(1, 17))


# ------------------------------------------------------------------------ disabled by default


def test_client_shm_disabled_by_default(infer_server: ServerProcess, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(infer_server.url)
    key = regions.create("r", 64, [np.zeros(16, dtype=np.float32)])
    for call in (lambda: client.register_system_shared_memory("r", key, 64),
                 lambda: client.unregister_system_shared_memory(),
                 lambda: client.unregister_system_shared_memory("r")):
        error = _error(call)
        assert (error.status(), error.message()) == ("503", DISABLED)
    assert client.get_system_shared_memory_status() == []
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32").set_shared_memory("r", 64)
    error = _error(lambda: client.infer("id_fp32", [tensor]))
    assert (error.status(), error.message()) == ("503", DISABLED)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("r", 64)
    plain = httpclient.InferInput("INPUT0", [1, 1], "FP32").set_data_from_numpy(np.ones((1, 1), np.float32))
    error = _error(lambda: client.infer("id_fp32", [plain], outputs=[output]))
    assert (error.status(), error.message()) == ("503", DISABLED)
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    assert_serves(infer_server.url)


def test_cuda_shared_memory_is_unsupported(client: Any, shm_server: ServerProcess) -> None:
    assert client.get_cuda_shared_memory_status() == []
    answer = post_json(shm_server.url, "/v2/cudasharedmemory/region/c/register",
                       {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8})
    assert (answer.status, answer.error()) == (501, "failed to register CUDA shared memory region: 'c', GPUs not "
                                                    "supported")
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("c")
    error = _error(lambda: client.get_cuda_shared_memory_status("c"))
    assert (error.status(), error.message()) == ("404", "Unable to find cuda shared memory region: 'c'")


# --------------------------------------------------------------------- unregister in flight


def _slow_trips(client: Any, seconds: float) -> int:
    """Loop trips of the slow model that take about `seconds` on this machine now."""
    tensor = httpclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([1000], np.int64))
    started = time.monotonic()
    client.infer("slow", [tensor])
    return max(1000, int(1000 * seconds / max(time.monotonic() - started, 1e-3)))


def test_unregister_while_a_request_runs(client: Any, regions: Regions, shm_server: ServerProcess) -> None:
    """Triton's newer behaviour: unregister succeeds, the regions stay until the request that uses
    them finishes (its output lands in the region), then they are gone."""
    trips = _slow_trips(client, 1.5)
    client.register_system_shared_memory("n", regions.create("n", 8, [np.array([trips], np.int64)]), 8)
    client.register_system_shared_memory("out", regions.create("out", 4), 4)
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        slow_client = httpclient.InferenceServerClient(shm_server.url, network_timeout=60)
        output = httpclient.InferRequestedOutput("OUT")
        output.set_shared_memory("out", 4)
        try:
            outcome["result"] = slow_client.infer(
                "slow", [httpclient.InferInput("N", [1], "INT64").set_shared_memory("n", 8)], outputs=[output])
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.5)  # let the request reach the model
    client.unregister_system_shared_memory()
    assert thread.is_alive(), "the slow request finished too early to test anything"
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["n", "out"]
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    assert regions.contents("out", np.float32, [1])[0] > 0
    assert client.get_system_shared_memory_status() == []
    assert_serves(shm_server.url)


def test_a_request_whose_client_went_away_lets_go_of_its_regions(client: Any, regions: Regions,
                                                                 shm_server: ServerProcess) -> None:
    """A client that hangs up while its request computes cancels it, and the cancelled request
    releases the regions it held: an unregister takes effect at once, not when the model is done."""
    trips = _slow_trips(client, 4.0)
    client.register_system_shared_memory("n", regions.create("n", 8, [np.array([trips], np.int64)]), 8)
    client.register_system_shared_memory("out", regions.create("out", 4), 4)
    body = json.dumps({
        "inputs": [{"name": "N", "shape": [1], "datatype": "INT64",
                    "parameters": {"shared_memory_region": "n", "shared_memory_byte_size": 8}}],
        "outputs": [{"name": "OUT", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 4}}],
    }).encode()
    host, port = shm_server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: naiad\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)  # let the request reach the model
    started = time.monotonic()
    client.unregister_system_shared_memory()
    while client.get_system_shared_memory_status() and time.monotonic() - started < 2.0:
        time.sleep(0.02)
    assert client.get_system_shared_memory_status() == [], "the cancelled request still holds its regions"
    # The model itself runs on to the end (onnxruntime cannot be interrupted); wait for it, then
    # the server serves as before.
    client.infer("slow", [httpclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([1], np.int64))])
    assert_serves(shm_server.url)


def _identity_through_regions(client: httpclient.InferenceServerClient) -> str:
    """One id_fp32 inference with its [1, 64] input in region "in" and its output in region
    "out" (256 bytes each): its HTTP status, "200" or the error's."""
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 256)
    try:
        client.infer("id_fp32", [httpclient.InferInput("INPUT0", [1, 64], "FP32").set_shared_memory("in", 256)],
                     outputs=[output])
    except InferenceServerException as error:
        return str(error.status())
    return "200"


def test_many_requests_racing_unregister(client: Any, regions: Regions, shm_server: ServerProcess) -> None:
    """Requests in flight while their regions come and go: each one succeeds or fails with a clear
    error, and the server keeps serving."""
    data = np.arange(64, dtype=np.float32).reshape(1, 64)
    in_key = regions.create("in", 256, [data])
    out_key = regions.create("out", 256)
    stop = threading.Event()
    statuses: list[str] = []
    unexpected: list[BaseException] = []

    def hammer() -> None:
        worker = httpclient.InferenceServerClient(shm_server.url, network_timeout=30)
        while not stop.is_set():
            try:
                statuses.append(_identity_through_regions(worker))
            except BaseException as error:
                unexpected.append(error)
                return
            if statuses[-1] not in ("200", "404"):
                unexpected.append(AssertionError(f"status {statuses[-1]}"))

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for name, key in (("in", in_key), ("out", out_key)):
            try:
                client.register_system_shared_memory(name, key, 256)
            except InferenceServerException as error:  # still held by a request: not yet unregistered
                assert "already in manager" in error.message()
        time.sleep(0.005)
        client.unregister_system_shared_memory()
    stop.set()
    for thread in threads:
        thread.join()
    assert unexpected == []
    assert "200" in statuses and "404" in statuses
    assert regions.contents("out", np.float32, [1, 64]).tolist() == data.tolist()
    assert_serves(shm_server.url)


def test_a_client_truncating_its_regions_cannot_kill_the_server(client: Any, regions: Regions,
                                                                shm_server: ServerProcess) -> None:
    """The attack: a client shrinks its objects to nothing and regrows them, as fast as it can,
    while its requests read and write them (a server copying through a mapping takes SIGBUS when
    that lands between its size check and its copy). Each of its requests succeeds or gets a 400;
    a bystander's plain inferences all succeed meanwhile, and the server serves on."""
    data = np.arange(64, dtype=np.float32).reshape(1, 64)
    keys = [regions.create("in", 256, [data]), regions.create("out", 256)]
    client.register_system_shared_memory("in", keys[0], 256)
    client.register_system_shared_memory("out", keys[1], 256)
    stop = threading.Event()
    attacker: list[str] = []
    bystander: list[float] = []
    unexpected: list[BaseException] = []

    def shrink_and_regrow() -> None:
        files = [os.open("/dev/shm" + key, os.O_RDWR) for key in keys]
        try:
            while not stop.is_set():
                for fd in files:
                    os.ftruncate(fd, 0)
                for fd in files:
                    os.ftruncate(fd, 256)
        finally:
            for fd in files:
                os.close(fd)

    def attack() -> None:
        worker = httpclient.InferenceServerClient(shm_server.url, network_timeout=30)
        while not stop.is_set():
            try:
                attacker.append(_identity_through_regions(worker))
            except BaseException as error:
                unexpected.append(error)
                return

    def bystand() -> None:
        worker = httpclient.InferenceServerClient(shm_server.url, network_timeout=30)
        tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32").set_data_from_numpy(data)
        while not stop.is_set():
            started = time.monotonic()
            try:
                assert worker.infer("id_fp32", [tensor]).as_numpy("OUTPUT0").tolist() == data.tolist()
            except BaseException as error:
                unexpected.append(error)
                return
            bystander.append(time.monotonic() - started)

    rss_before = _rss_bytes(shm_server.process.pid)
    threads = [threading.Thread(target=run) for run in (shrink_and_regrow, attack, attack, bystand)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join()
    assert unexpected == []
    assert set(attacker) <= {"200", "400"} and len(attacker) > 50, sorted(set(attacker))
    assert len(bystander) > 20
    p99 = sorted(bystander)[int(len(bystander) * 0.99)]
    growth = _rss_bytes(shm_server.process.pid) - rss_before
    print(f"bystander p99 {p99 * 1e3:.1f} ms over {len(bystander)} calls; server RSS growth {growth / 2**20:.1f} MiB")
    assert p99 < 1.0  # identity calls of a few ms: a second means the bystander was starved
    assert growth < 64 * 2**20  # 256-byte regions: tens of MiB would be a leak per attack
    assert_serves(shm_server.url)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
