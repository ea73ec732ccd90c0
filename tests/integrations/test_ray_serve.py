"""naiad as a Ray Serve deployment (naiad.integrations.ray_serve), on a real local Ray.

tritonclient.http talks to Serve's HTTP proxy as to naiad itself (binary-tensor extension
included); under 12 concurrent clients of a slow model Serve scales the deployment from 1 to 3
replicas without failing a request. Skipped only where Ray is not installed (the `ray` extra).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
import tritonclient.http as httpclient  # noqa: E402
from ray import serve  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from naiad.integrations.ray_serve import build_app  # noqa: E402

pytestmark = pytest.mark.ray

SLEEP_S = 0.25

SLOW_IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

SLOW_IDENTITY_MODEL = f"""
import time
import urllib.error
import urllib.request

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({SLEEP_S})  # one request at a time per replica: load piles up, Serve scales out
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())
            ])
            for r in requests
        ]
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ray-serve-repo")
    (repo / "slow_identity" / "1").mkdir(parents=True)
    (repo / "slow_identity" / "config.pbtxt").write_text(SLOW_IDENTITY_CONFIG)
    (repo / "slow_identity" / "1" / "model.py").write_text(SLOW_IDENTITY_MODEL)
    return repo


@pytest.fixture(scope="module")
def serve_url(repository: Path) -> Iterator[str]:
    """A local Ray (4 logical CPUs: 3 replicas of 1) running the deployment; its proxy's host:port."""
    # address="local": a cluster of our own, never one some `ray start` left on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Ray 2.60 pushes replicas' load every 10 s (metrics_interval_s) and wants a look-back
        # window longer than that (a shorter one warns now and is to raise in a later release).
        app = build_app(
            repository, min_replicas=1, max_replicas=3, target_ongoing_requests=2,
            autoscaling_config={"upscale_delay_s": 0.5, "downscale_delay_s": 600, "look_back_period_s": 12},
        )
        serve.run(app, name="naiad", route_prefix="/")
        yield f"127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _running_replicas() -> int:
    deployment = serve.status().applications["naiad"].deployments["naiad"]
    return sum(count for state, count in deployment.replica_states.items() if str(state).endswith("RUNNING"))


def _infer(client: httpclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer("slow_identity", [tensor], outputs=[output])
    return result.as_numpy("OUTPUT0")


def test_tritonclient_infers_through_serve(serve_url: str) -> None:
    client = httpclient.InferenceServerClient(serve_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("slow_identity")
        assert client.get_model_metadata("slow_identity")["inputs"][0]["name"] == "INPUT0"
        data = np.arange(7, dtype=np.float32) * 1.5
        np.testing.assert_array_equal(_infer(client, data), data)
        # A V2 error comes back as naiad answered it: status and message unchanged.
        missing = httpclient.InferInput("INPUT0", [1], "FP32")
        missing.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException, match="unknown model") as raised:
            client.infer("no_such_model", [missing])
        assert raised.value.status() == "404"  # naiad's own status for an unknown model
    finally:
        client.close()


def test_route_prefix_is_stripped_before_naiad(serve_url: str, repository: Path) -> None:
    # A second application under /tenant: naiad sees /v2/..., as behind an ingress that strips it.
    serve.run(build_app(repository), name="prefixed", route_prefix="/tenant")
    try:
        with urllib.request.urlopen(f"http://{serve_url}/tenant/v2/models/slow_identity?x=1", timeout=30) as reply:
            assert json.loads(reply.read())["name"] == "slow_identity"
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(f"http://{serve_url}/tenant/v2/models/absent", timeout=30)
        assert raised.value.code == 404 and "absent" in raised.value.read().decode()
    finally:
        serve.delete("prefixed")


def test_scales_from_one_to_three_replicas_under_load(serve_url: str) -> None:
    assert _running_replicas() == 1
    stop = threading.Event()
    done: list[int] = []
    failures: list[BaseException] = []

    def client_loop(seed: int) -> None:
        client = httpclient.InferenceServerClient(serve_url, network_timeout=120)
        try:
            count = 0
            while not stop.is_set():
                data = np.full(4, seed * 1000 + count, dtype=np.float32)
                try:
                    result = _infer(client, data)
                    if not np.array_equal(result, data):
                        raise AssertionError(f"client {seed} got {result} for {data}")
                except BaseException as error:
                    failures.append(error)
                    return
                count += 1
            done.append(count)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not failures:
            seen.append(_running_replicas())
            if seen[-1] == 3:
                break
            time.sleep(0.5)
        time.sleep(2)  # load on all three replicas for a moment
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not failures, [str(failure) for failure in failures[:3]]  # tritonclient errors repr as ""
    assert max(seen) == 3, f"replicas seen: {seen}"
    assert _running_replicas() <= 3  # max_replicas bounds it
    assert len(done) == 12 and sum(done) > 12


def test_bad_options_are_refused_before_deploying(repository: Path) -> None:
    with pytest.raises(ValueError, match="--http-port"):
        build_app(repository, ["--http-port", "9000"])
    with pytest.raises(ValueError, match="min_replicas=3 max_replicas=1"):
        build_app(repository, min_replicas=3, max_replicas=1)


