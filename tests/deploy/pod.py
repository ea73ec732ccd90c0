"""Run a manifest's naiad container as a local process, as the kubelet would, minus the cluster:
its command and args unchanged except the repository path and the ports (free loopback ports
instead), then its probes polled on the ports they name."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from build_models import add_sub
from conftest import free_ports
from e2e.repo_builder import write_model

from deploy.tools import container_command, tritonserver_binary

SIMPLE_CONFIG = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")
REPOSITORY_FLAGS = ("--model-repository", "--model-store")


def write_simple_repository(repo: Path) -> Path:
    """Triton's `simple` add/sub model (INT32[16]) as a one-model repository."""
    write_model(repo, "simple", SIMPLE_CONFIG, {1: add_sub})
    return repo


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@dataclass
class LocalPod:
    """The running container: `ports` maps the manifest's port numbers to the local ones."""

    container: dict[str, Any]
    ports: dict[int, int]
    argv: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    named_ports: dict[str, int] = field(default_factory=dict)

    def local_port(self, port: int | str) -> int:
        """A probe's or Service's port (a number or a container port name), mapped to its local port."""
        number = self.named_ports[port] if isinstance(port, str) else port
        return self.ports[number]

    def probe(self, kind: str) -> int:
        """Run the container's httpGet probe of `kind` (startupProbe, livenessProbe, readinessProbe) once."""
        get = self.container[kind]["httpGet"]
        return http_status(f"http://127.0.0.1:{self.local_port(get['port'])}{get['path']}")

    def wait_probe(self, kind: str, timeout: float = 60.0) -> None:
        """Poll like the kubelet (faster) until the probe succeeds; fail if the process dies."""
        get = self.container[kind]["httpGet"]
        self.wait_http(get["path"], get["port"], timeout)

    def wait_http(self, path: str, port: int | str, timeout: float = 60.0) -> None:
        """Poll GET `path` on the manifest's `port` until it answers 200."""
        url = f"http://127.0.0.1:{self.local_port(port)}{path}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"naiad exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if http_status(url) == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{url} did not answer 200 within {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def _local_args(args: list[str], repository: Path, ports: dict[int, int]) -> list[str]:
    """The manifest's args with the repository and port values swapped for local ones."""
    local: list[str] = []
    for arg in args:
        flag, equals, value = arg.partition("=")
        if flag in PORT_FLAGS + REPOSITORY_FLAGS and not equals:
            raise AssertionError(f"write {flag} as {flag}=VALUE in manifests, got {arg!r}")
        if flag in REPOSITORY_FLAGS:
            local.append(f"{flag}={repository}")
        elif flag in PORT_FLAGS:
            local.append(f"{flag}={ports[int(value)]}")
        else:
            local.append(arg)
    # Listen on loopback only: the manifests' 0.0.0.0 is the pod's own network namespace.
    return [*local, "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]


@contextmanager
def run_container(container: dict[str, Any], repository: Path, log_path: Path) -> Iterator[LocalPod]:
    command, args = container_command(container)
    assert command == ["tritonserver"], command
    manifest_ports = sorted({int(arg.partition("=")[2]) for arg in args if arg.partition("=")[0] in PORT_FLAGS})
    ports = dict(zip(manifest_ports, free_ports(len(manifest_ports)), strict=True))
    named = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    assert set(named.values()) <= set(ports), f"container ports {named} not all served by the args"
    argv = [str(tritonserver_binary()), *_local_args(args, repository, ports)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    pod = LocalPod(container, ports, argv, process, log_path, named)
    try:
        yield pod
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def infer_simple_http(url: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    with httpclient.InferenceServerClient(url) as client:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def infer_simple_grpc(url: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    with grpcclient.InferenceServerClient(url) as client:
        assert client.is_server_ready()
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
