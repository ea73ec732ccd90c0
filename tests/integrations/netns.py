"""Two network namespaces joined by a veth pair, and a Ray node in each: a two-node cluster on
one machine (root only: creating namespaces needs CAP_SYS_ADMIN; CI runs as root).

Every name carries this process's pid, so that concurrent runs do not collide; `TwoNodes.close`
stops the Ray nodes it started (their process groups) and deletes the namespaces, which takes
the veth pair with them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

HEAD_IP, WORKER_IP = "10.200.0.1", "10.200.0.2"
RAY_PORT = 6379
RAY = Path(sys.executable).with_name("ray")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class TwoNodes:
    """Namespaces `head` (HEAD_IP) and `worker` (WORKER_IP), a Ray head in the first and a Ray
    worker node in the second; `run` executes a command inside `head`."""

    def __init__(self, log_dir: Path, cpus_per_node: int = 2) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the two-node Ray tests create network namespaces: run them as root")
        tag = os.getpid() % 100000
        self.head, self.worker = f"naiad-ray-a{tag}", f"naiad-ray-b{tag}"
        self.head_if, self.worker_if = f"nra{tag}", f"nrb{tag}"  # interface names: at most 15 chars
        self.log_dir = log_dir
        # This cluster's own token (Ray 2.60 authenticates every RPC): nodes and driver share it.
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env.pop("RAY_ADDRESS", None)
        self.nodes: list[subprocess.Popen[bytes]] = []
        self._logs: list[object] = []
        self.namespaces: list[str] = []
        try:
            self._link()
            self._start_node(self.head, "head", ["--head", "--port", str(RAY_PORT), "--node-ip-address", HEAD_IP,
                                                     "--include-dashboard", "false"],
                             cpus_per_node)
            self._wait_port(self.head, HEAD_IP, RAY_PORT)
            self._start_node(self.worker, "worker", ["--address", f"{HEAD_IP}:{RAY_PORT}",
                                                     "--node-ip-address", WORKER_IP], cpus_per_node)
        except BaseException:
            self.close()
            raise

    def _link(self) -> None:
        for namespace in (self.head, self.worker):
            _ip("netns", "add", namespace)
            self.namespaces.append(namespace)
        _ip("link", "add", self.head_if, "type", "veth", "peer", "name", self.worker_if)
        for namespace, interface, address in ((self.head, self.head_if, HEAD_IP),
                                              (self.worker, self.worker_if, WORKER_IP)):
            _ip("link", "set", interface, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", interface)
            _ip("-n", namespace, "link", "set", interface, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")  # Ray's processes also talk over loopback

    def _start_node(self, namespace: str, name: str, args: list[str], cpus: int) -> None:
        log = open(self.log_dir / f"ray-{name}.log", "wb")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        command = ["ip", "netns", "exec", namespace, str(RAY), "start", "--block", "--num-cpus", str(cpus),
                   "--disable-usage-stats", *args]
        # Its own process group: close() ends exactly the Ray processes this node started.
        self.nodes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _wait_port(self, namespace: str, host: str, port: int, timeout: float = 60.0) -> None:
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                raise RuntimeError(f"a Ray node exited early; see {self.log_dir}")
            if self.run([sys.executable, "-c", probe], timeout=10).returncode == 0:
                return
            time.sleep(0.5)
        raise TimeoutError(f"the Ray head did not listen on {host}:{port} within {timeout}s")

    def check_alive(self) -> None:
        """Raise if a Ray node's `ray start` has exited (its log says why)."""
        for node, name in zip(self.nodes, ("head", "worker"), strict=False):
            if node.poll() is not None:
                log = (self.log_dir / f"ray-{name}.log").read_text()
                raise RuntimeError(f"the Ray {name} node exited: {log[-2000:]}")

    def run(self, command: list[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`command` inside the head's namespace (with the cluster's token and `env`), output captured."""
        return subprocess.run(["ip", "netns", "exec", self.head, *command], capture_output=True, text=True,
                              timeout=timeout, env={**self.env, **(env or {})}, cwd=cwd)

    def close(self) -> None:
        for node in self.nodes:  # `ray start --block` stops its node's processes on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
        for node in self.nodes:
            # A node drains for up to 30 s on SIGTERM; nothing runs on it by now, so 5 s is plenty.
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(5)
            # Whatever of its group is left (raylet, workers) goes with the group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(10)
        for log in self._logs:
            log.close()  # type: ignore[attr-defined]
        for namespace in reversed(self.namespaces):  # deleting a namespace deletes its veth end, and the pair
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "delete", namespace)
        self.namespaces = []
