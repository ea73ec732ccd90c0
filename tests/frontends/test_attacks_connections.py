"""Idle connections and the connection limit against a real server (finding 9 of the hardening
issue): thousands of idle sockets used to exhaust the open-file limit and lock every new HTTP and
gRPC client out. Now idle connections are closed (--http-idle-timeout-secs,
--grpc-max-connection-idle-ms) and the server holds at most --max-connections: a newcomer takes
the place of an idle connection, and is refused cleanly (503, GOAWAY) only when every place is
busy. Bounded and loopback only (tests/frontends/hostile.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess
from e2e.repo_builder import write_model
from frontends.hostile import (
    ECHO,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    H2,
    HEADERS,
    NO_ERROR,
    Bystander,
    Watch,
    attack_server,
    connections,
)

LIMIT = 64
IDLE_S = 1.0
READ_TIMEOUT_S = 3.0
ANSWER_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("connection-attacks")
    write_model(root / "repo", "echo", ECHO, {1: lambda path: None})
    with attack_server(_args(root), root / "naiad.log") as process:
        yield process


def _args(root: Path) -> list[str]:
    return ["--model-repository", str(root / "repo"), f"--max-connections={LIMIT}",
            f"--http-idle-timeout-secs={IDLE_S}", f"--grpc-max-connection-idle-ms={int(IDLE_S * 1000)}",
            f"--http-read-timeout-secs={READ_TIMEOUT_S}"]


@pytest.fixture(scope="module")
def bystanders(server: ServerProcess) -> Iterator[tuple[Bystander, Bystander]]:
    clients = Bystander("http", server.url, "echo"), Bystander("grpc", server.grpc_url, "echo")
    yield clients
    for client in clients:
        client.stop()


def _closed(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before closing `sock` within `timeout`, or None if it stayed open."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    received = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def test_idle_connections_are_closed(server: ServerProcess, bystanders: tuple[Bystander, Bystander]) -> None:
    """20 keep-alive HTTP connections after one request each and 20 gRPC connections without a
    call: each is closed once idle for the timeout (gRPC with GOAWAY max_idle)."""
    http, grpc = bystanders
    grpc.wait_served()
    with Watch("40 idle connections", server.process.pid, http) as figures:
        with connections(server.url, 20) as keep_alive:
            for sock in keep_alive:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: naiad\r\n\r\n")
                sock.settimeout(5)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            silent = [H2(server.grpc_url) for _ in range(20)]
            start = time.monotonic()
            closed_http = [_closed(sock, IDLE_S + ANSWER_S) for sock in keep_alive]
            goaways = [h2.read_until(GOAWAY, max(start + IDLE_S + ANSWER_S - time.monotonic(), 0.01))[0]
                       for h2 in silent]
            elapsed = time.monotonic() - start
            for h2 in silent:
                h2.close()
        figures.response = (f"{sum(x is not None for x in closed_http)} of 20 HTTP and "
                            f"{sum(x is not None for x in goaways)} of 20 gRPC connections closed within "
                            f"{elapsed:.2f} s")
    assert all(x is not None for x in closed_http), figures
    assert all(x is not None and x.code() == NO_ERROR and b"max_idle" in x.payload for x in goaways), figures
    assert grpc.between(start, time.monotonic()) and all(ok for _, ok in grpc.between(start, time.monotonic()))


def test_a_flood_of_idle_sockets_cannot_hold_more_than_the_limit(server: ServerProcess,
                                                                 bystanders: tuple[Bystander, Bystander]) -> None:
    """300 sockets that send nothing, half on each port: each newcomer past the limit takes the
    place of the oldest of them, so the server never holds more than --max-connections and the
    clients already connected go on being served."""
    http, grpc = bystanders
    grpc.wait_served()
    with Watch("300 idle sockets, limit 64", server.process.pid, http) as figures:
        start = time.monotonic()
        with connections(server.url, 150) as idle_http, connections(server.grpc_url, 150) as idle_grpc:
            time.sleep(0.5)
            still_open = [sock for sock in idle_http + idle_grpc if _closed(sock, 0.01) is None]
            closed_in = time.monotonic() - start
            fresh = H2(server.grpc_url)  # a newcomer now: served at once
            fresh.send(fresh.headers(1, "/inference.GRPCInferenceService/ServerLive", end=True))
            answered = fresh.read_until(HEADERS, ANSWER_S, 1)[0]  # its response HEADERS
            fresh.close()
        figures.response = (f"{len(still_open)} of 300 still open after {closed_in:.2f} s; a newcomer "
                            f"{'served' if answered is not None else 'not served'}")
    assert len(still_open) <= LIMIT, figures
    assert answered is not None, figures
    served = grpc.between(start, time.monotonic())
    assert served and all(ok for _, ok in served), "the gRPC bystander failed"


@pytest.fixture
def quiet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same server, with no bystander taking places."""
    root = tmp_path_factory.mktemp("connection-limit")
    write_model(root / "repo", "echo", ECHO, {1: lambda path: None})
    with attack_server(_args(root), root / "naiad.log") as process:
        yield process


def test_newcomers_are_refused_cleanly_when_every_place_is_busy(quiet_server: ServerProcess) -> None:
    """64 connections each in the middle of a request (busy: none can make room): a new HTTP
    connection gets 503 and a new gRPC one GOAWAY ENHANCE_YOUR_CALM, at once; once the read
    timeout frees the places, newcomers are served again. (No bystander here: a limit full of
    busy connections locks everyone out until then, as nginx's worker_connections does.)"""
    server = quiet_server
    busy: list[socket.socket] = []
    try:
        with Watch("64 busy connections, then newcomers", server.process.pid, None) as figures:
            for _ in range(LIMIT):
                busy.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=10))
                busy[-1].sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\n")  # never finished
            time.sleep(0.2)
            start = time.monotonic()
            with connections(server.url, 1) as (newcomer,):
                http_answer = _closed(newcomer, ANSWER_S) or b""
            grpc_newcomer = H2(server.grpc_url)
            goaway = grpc_newcomer.read_until(GOAWAY, ANSWER_S)[0]
            grpc_newcomer.close()
            refused_in = time.monotonic() - start
            time.sleep(READ_TIMEOUT_S + 0.5)  # the busy ones time out (408) and close
            later = H2(server.grpc_url)
            later.send(later.headers(1, "/inference.GRPCInferenceService/ServerLive", end=True))
            served_later = later.read_until(HEADERS, 5, 1)[0]
            later.close()
            figures.response = (f"HTTP {http_answer[:12]!r}, gRPC GOAWAY "
                                f"{goaway.code() if goaway is not None else None} within {refused_in:.2f} s; "
                                f"served again after the read timeout: {served_later is not None}")
    finally:
        for sock in busy:
            sock.close()
    assert http_answer.startswith(b"HTTP/1.1 503 ") and b"--max-connections" in http_answer, figures
    assert goaway is not None and goaway.code() == ENHANCE_YOUR_CALM, figures
    assert refused_in < 2 * ANSWER_S, figures
    assert served_later is not None, figures
