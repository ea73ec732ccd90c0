"""Shared fixtures: build model repositories with real ONNX models, run real `naiad serve` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# A bound on a server's start-up (a process that exits is reported at once), never reached when
# things work: the bundled LLM's server took 206 s to be ready on the 2-core machine at a load
# average of 11 (two busy loops and other test suites beside it).
STARTUP_TIMEOUT_S = 300.0


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all bound at once, so never the same twice)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class ServerProcess:
    """A `naiad serve` child process on free loopback ports: HTTP at `url`, gRPC at `grpc_url`."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        command = [sys.executable, "-m", "naiad.cli", "serve", "--http-address", "127.0.0.1",
                   "--http-port", str(self.http_port), "--grpc-address", "127.0.0.1",
                   "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port), *args]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def wait_live(self, timeout: float = STARTUP_TIMEOUT_S, ready: bool = True) -> None:
        """Poll the health endpoint (never the logs) until it answers 200."""
        path = "/v2/health/ready" if ready else "/v2/health/live"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"naiad exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if self.get(path) == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"naiad not {'ready' if ready else 'live'} after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    """`start_server(args, ready=True)` starts naiad and waits for readiness; all are stopped at the end."""
    servers: list[ServerProcess] = []

    def start(args: list[str], ready: bool = True, wait: bool = True) -> ServerProcess:
        server = ServerProcess(args, tmp_path / f"naiad-{len(servers)}.log")
        servers.append(server)
        if wait:
            server.wait_live(ready=ready)
        return server

    yield start
    for server in servers:
        server.stop()


@contextmanager
def running_server(args: list[str], log_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(args, log_path)
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def example_repo() -> Path:
    """The bundled example repository (prepared by `make examples`, or here if it was not)."""
    repo = EXAMPLES / "models"
    if not (repo / "simple" / "1" / "model.onnx").exists():
        subprocess.run([sys.executable, str(EXAMPLES / "prepare.py"), "--repo", str(repo)], check=True)
    return repo


@pytest.fixture(scope="session")
def example_server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on the example repository shared by read-only tests."""
    with running_server(["--model-repository", str(example_repo)],
                        tmp_path_factory.mktemp("example") / "naiad.log") as server:
        yield server


os.environ.setdefault("PYTHONUNBUFFERED", "1")
