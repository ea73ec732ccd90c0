"""A `naiad serve` child process for `naiad tune MODEL_DIR` when no `--url` is given: the model's
repository in explicit model control (so configs can be loaded through the repository API) on
free loopback ports. It is a separate process, as any server tune drives would be."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServerStartError(RuntimeError):
    """The server exited or did not become ready; the message carries its log's tail."""


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class ServeProcess:
    """`naiad serve --model-repository REPO --model-control-mode explicit --load-model MODEL`."""

    def __init__(self, repository: Path, model: str, log_path: Path, extra: list[str] | None = None) -> None:
        self.http_port, self.grpc_port, metrics_port = _free_ports(3)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(repository),
                "--model-control-mode", "explicit", f"--load-model={model}", "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", f"--http-port={self.http_port}",
                f"--grpc-port={self.grpc_port}", f"--metrics-port={metrics_port}", "--console=false",
                *(extra or [])]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"naiad serve exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ServerStartError(f"naiad serve not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
