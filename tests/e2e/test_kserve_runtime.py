"""naiad as a drop-in for KServe's stock Triton ServingRuntime (kserve-tritonserver).

KServe runs `tritonserver --model-store=/mnt/models --grpc-port=9000 --http-port=8080
--allow-grpc=true --allow-http=true` (config/runtimes/kserve-tritonserver.yaml) and scrapes
metrics on 8002. These tests run the real `tritonserver` console script naiad installs, with
those flags on free ports, and check what a cluster relies on: readiness, inference over HTTP and
gRPC, and a SIGTERM that turns readiness false before draining while no in-flight request fails.
"""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ROOT, free_ports

from e2e.scaling_util import wait_pending
from e2e.test_shutdown import VALUES, _grpc_infer, _http_infer, _repo
from naiad.cli import build_parser, build_tritonserver_parser, options_from_args

pytestmark = pytest.mark.e2e

# The container args of KServe's stock runtime, after its `tritonserver` command.
KSERVE_ARGS = ["--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
               "--allow-grpc=true", "--allow-http=true"]
TRITONSERVER = Path(sys.executable).parent / "tritonserver"


def test_kserve_runtime_args_parse_to_its_ports_in_both_entry_points() -> None:
    for parser, argv in ((build_tritonserver_parser(), KSERVE_ARGS),
                         (build_parser(), ["serve", *KSERVE_ARGS]),
                         (build_parser(), ["tritonserver", *KSERVE_ARGS])):
        options = options_from_args(parser.parse_args(argv), parser)
        assert options.model_repositories == (Path("/mnt/models"),)
        assert (options.http_port, options.grpc_port, options.metrics_port) == (8080, 9000, 8002)
        assert options.allow_http and options.allow_grpc and options.allow_metrics


def test_tritonserver_rejects_an_unknown_flag_clearly() -> None:
    result = subprocess.run([str(TRITONSERVER), "--model-store=/mnt/models", "--no-such-flag"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "usage: tritonserver" in result.stderr and "--no-such-flag" in result.stderr


class Runtime:
    """The `tritonserver` script run with KServe's args, on free loopback ports."""

    def __init__(self, repo: Path, log_path: Path, extra: list[str]) -> None:
        http_port, grpc_port, metrics_port = free_ports(3)
        self.url, self.grpc_url = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
        self.metrics_port = metrics_port
        args = [arg.replace("/mnt/models", str(repo)).replace("=9000", f"={grpc_port}")
                .replace("=8080", f"={http_port}") for arg in KSERVE_ARGS]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [str(TRITONSERVER), *args, f"--metrics-port={metrics_port}", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1", *extra], stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)

    def ready_status(self, connection: http.client.HTTPConnection | None = None) -> int:
        own = connection is None
        connection = connection or http.client.HTTPConnection(self.url, timeout=5)
        try:
            connection.request("GET", "/v2/health/ready")
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            if own:
                connection.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if self.ready_status() == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _wait_refused(runtime: Runtime, timeout: float = 10.0) -> None:
    """Until the listener refuses new connections (the signal takes a moment to land)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            runtime.ready_status()
        except ConnectionRefusedError:
            return
        except ConnectionResetError:
            pass  # it reached the backlog as the listener closed: the next try is refused
        assert time.monotonic() < deadline, f"new connections still accepted {timeout} s after SIGTERM"
        time.sleep(0.02)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """The delayed identity model (2 s per request, 4 instances) behind KServe's args."""
    server = Runtime(_repo(tmp_path, 2000, instances=4), tmp_path / "tritonserver.log", ["--exit-timeout-secs=30"])
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_kserve_args_serve_http_and_grpc_inference(runtime: Runtime) -> None:
    with grpcclient.InferenceServerClient(runtime.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready("delayed")
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(_http_infer, runtime.url), pool.submit(_grpc_infer, runtime.grpc_url)]
        for answer in answers:
            np.testing.assert_array_equal(answer.result(timeout=60), VALUES)


def test_sigterm_turns_unready_before_draining_and_no_in_flight_request_fails(runtime: Runtime) -> None:
    kept = http.client.HTTPConnection(runtime.url, timeout=30)  # a probe connection opened before
    assert runtime.ready_status(kept) == 200
    grpc_probe = grpcclient.InferenceServerClient(runtime.grpc_url)
    assert grpc_probe.is_server_ready()
    # Eight requests on four instances: four run, four queue behind them (about 4 s in all).
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_http_infer, runtime.url) for _ in range(4)]
        futures += [pool.submit(_grpc_infer, runtime.grpc_url) for _ in range(4)]
        wait_pending(runtime.metrics_port, "delayed", 4)  # all eight reached the server
        assert not any(f.done() for f in futures)
        runtime.process.send_signal(signal.SIGTERM)
        # Not ready while requests are still draining: the kubelet's probe (a new connection)
        # is refused, an open connection hears 400 (Triton's "not ready"), gRPC's ServerReady
        # says false.
        _wait_refused(runtime)
        draining = [f for f in futures if not f.done()]
        assert runtime.ready_status(kept) == 400
        assert not grpc_probe.is_server_ready()
        assert draining and not all(f.done() for f in draining)
        for future in futures:
            np.testing.assert_array_equal(future.result(timeout=30), VALUES)
    kept.close()
    grpc_probe.close()
    assert runtime.process.wait(30) == 0
    assert "Exit timeout expired" not in runtime.logs()
