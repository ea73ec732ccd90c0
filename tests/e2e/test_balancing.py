"""Balanced replicas: two naiad instances behind a round-robin TCP proxy (a Kubernetes Service
spreads connections, not requests). A gRPC channel keeps its one connection for ever, so without
a maximum connection age every call of a long-lived client lands on one replica (Triton
server#6177, client#820); with --grpc-max-connection-age-ms the server ends old connections, the
channel reconnects through the proxy, and calls spread over both. The same for HTTP keep-alive
with --http-max-requests-per-connection. Each instance's own nv_inference_request_success
counter tells where the requests went; no request may fail while connections turn over.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from e2e.scaling_util import RoundRobinProxy, scrape, total
from e2e.test_shutdown import VALUES, _repo

pytestmark = pytest.mark.e2e

RUN_SECS = 4.0  # about four connection ages of 1 s


def _successes(server: Any) -> float:
    return total(scrape(server.metrics_port), "nv_inference_request_success", model="delayed")


def _pair(tmp_path: Path, start_server: Any, *flags: str) -> list[Any]:
    repo = _repo(tmp_path, 5, instances=4)  # the identity model, 5 ms per request
    return [start_server(["--model-repository", str(repo), *flags]) for _ in range(2)]


def _backends(servers: list[Any], attribute: str) -> list[tuple[str, int]]:
    return [("127.0.0.1", int(getattr(server, attribute).rsplit(":", 1)[1])) for server in servers]


@pytest.mark.parametrize("transport", ["naiad", "grpcio"])
def test_one_grpc_channel_spreads_over_both_replicas_with_a_max_connection_age(
        transport: str, tmp_path: Path, start_server: Any) -> None:
    servers = _pair(tmp_path, start_server, f"--grpc-transport={transport}", "--grpc-max-connection-age-ms=1000",
                    "--grpc-max-connection-age-grace-ms=5000")
    sent = 0
    with RoundRobinProxy(_backends(servers, "grpc_url")) as proxy, \
            grpcclient.InferenceServerClient(proxy.url) as client:
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(VALUES)
        deadline = time.monotonic() + RUN_SECS
        while time.monotonic() < deadline:
            answer = client.infer("delayed", [tensor], client_timeout=30)  # any failure fails the test
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), VALUES)
            sent += 1
        connections = dict(proxy.connections)
    counts = [_successes(server) for server in servers]
    print(f"{transport}: {sent} calls, per instance {counts}, connections {connections}")  # shown with -rP
    assert sum(counts) == sent, (counts, sent)
    assert min(counts) > 0, f"all {sent} requests went to one replica: {counts}, connections {connections}"
    assert connections.get(0, 0) >= 1 and connections.get(1, 0) >= 1


def test_without_an_age_one_grpc_channel_stays_on_one_replica(tmp_path: Path, start_server: Any) -> None:
    """The problem the option solves, shown on the same setup."""
    servers = _pair(tmp_path, start_server)
    with RoundRobinProxy(_backends(servers, "grpc_url")) as proxy, \
            grpcclient.InferenceServerClient(proxy.url) as client:
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(VALUES)
        for _ in range(40):
            client.infer("delayed", [tensor], client_timeout=30)
    assert sorted(_successes(server) for server in servers) == [0, 40]


def _raw_get(sock: socket.socket) -> bytes:
    """One keep-alive GET on `sock`; returns the response head (the body is empty-ish JSON)."""
    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head.lower()


def test_http_max_requests_per_connection_closes_and_the_next_request_reconnects(
        tmp_path: Path, start_server: Any) -> None:
    servers = _pair(tmp_path, start_server, "--http-max-requests-per-connection=3")
    host, port = servers[0].url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        heads = [_raw_get(sock) for _ in range(3)]
        assert [b"connection: close" in head for head in heads] == [False, False, True]
        assert all(head.startswith(b"http/1.1 200") for head in heads)
        assert sock.recv(1) == b""  # and it is closed
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # the next one: a new connection
        assert _raw_get(sock).startswith(b"http/1.1 200")

    # tritonclient's keep-alive HTTP client through the proxy: no failure, both replicas used.
    with RoundRobinProxy(_backends(servers, "url")) as proxy:
        client = httpclient.InferenceServerClient(proxy.url, network_timeout=30)
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(VALUES)
        for _ in range(30):
            np.testing.assert_array_equal(client.infer("delayed", [tensor]).as_numpy("OUTPUT0"), VALUES)
        client.close()
        connections = dict(proxy.connections)
    counts = [_successes(server) for server in servers]
    print(f"http: 30 requests, per instance {counts}, connections {connections}")
    assert sum(counts) == 30 and min(counts) > 0, counts
    assert sum(connections.values()) >= 10  # a new connection every three requests
