"""A `naiad serve` child process on a free loopback port: what each Ray Serve replica runs.

A child process, not an `InferenceServer` inside the replica: `naiad serve` owns its event loop
and installs its SIGTERM / SIGINT handlers (main thread only), and its backends start model
processes of their own; a Serve replica runs user code on a thread of Ray's worker process, with
Ray's own loop and signal handling. The child is exactly the server `naiad serve` runs, flags
included, and it dies with the replica: PR_SET_PDEATHSIG sends it SIGTERM when the replica's
process goes (Serve kills replicas it scales down). PDEATHSIG follows the *thread* that started
the child: Serve runs a replica's constructor on its user-code event-loop thread, which lives as
long as the replica.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

#: Flags the adapter sets itself: the child must listen where the replica forwards to.
RESERVED_FLAGS = ("--model-repository", "--http-port", "--http-address", "--allow-http")

_PR_SET_PDEATHSIG = 1


def check_naiad_args(args: Sequence[str]) -> list[str]:
    """`args` as a list; ValueError when one of them is a flag the adapter owns."""
    args = list(args)
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS:
            raise ValueError(f"naiad_args may not set {flag}: the Ray Serve adapter sets it for each replica")
    return args


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class NaiadProcess:
    """One `naiad serve` on 127.0.0.1:`port`, HTTP only unless `args` turn gRPC or metrics on."""

    def __init__(self, repository: str | Path, args: Sequence[str] = (), startup_timeout: float = 120.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(repository),
            "--http-address", "127.0.0.1", "--http-port", str(self.port),
            # Off unless asked for: N replicas on one node would fight over the default ports.
            "--allow-grpc", "false", "--allow-metrics", "false",
            *check_naiad_args(args),
        ]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        preexec = _die_with_parent if sys.platform == "linux" else None
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=preexec)
        try:
            self._wait_ready(startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"naiad serve exited with code {self.process.returncode}:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"naiad serve was not ready after {timeout}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        """naiad's own readiness: GET /v2/health/ready answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, size: int = 4000) -> str:
        # pread, not seek and read: the child writes through a descriptor that shares this file's
        # offset, and a seek here would move where its next line lands.
        end = os.fstat(self._log.fileno()).st_size
        start = max(0, end - size)
        return os.pread(self._log.fileno(), end - start, start).decode(errors="replace")

    def describe(self, wait: float = 0.0) -> str:
        """What became of the process (waiting up to `wait` seconds for it to end), and the tail
        of its log: for the replica's own log when naiad fails a request it should have answered,
        since naiad's log goes with the replica."""
        try:
            code = self.process.wait(wait) if wait > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            state = "is running"
        elif code < 0:
            state = f"was killed by signal {-code} ({signal.strsignal(-code)})"
        else:
            state = f"exited with code {code}"
        return f"naiad serve (pid {self.process.pid}) {state}; the end of its log:\n{self.log_tail()}"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (naiad drains in-flight requests), then SIGKILL after `timeout`."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
