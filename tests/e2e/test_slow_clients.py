"""Slow and oversized clients against a real server: slowloris connections on HTTP and gRPC are
closed after --http-read-timeout-secs / --grpc-handshake-timeout-secs while normal clients are
served, and a body declared over --http-max-input-size is refused before it is sent."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server

from e2e.repo_builder import write_model

IDENTITY = """
name: "echo"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
READ_TIMEOUT = 1.0
MAX_INPUT = 4096
SLOW_CONNECTIONS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("slow") / "repo"
    write_model(repo, "echo", IDENTITY, {1: lambda path: None})
    args = ["--model-repository", str(repo), f"--http-read-timeout-secs={READ_TIMEOUT}",
            f"--http-max-input-size={MAX_INPUT}", f"--grpc-handshake-timeout-secs={READ_TIMEOUT}"]
    with running_server(args, tmp_path_factory.mktemp("slow-log") / "naiad.log") as process:
        yield process


def _connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket, limit: float) -> bytes:
    """Everything the server sends until it closes the connection (or `limit` seconds pass)."""
    sock.settimeout(limit)
    received = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            return received + b"<closed>"
        received += chunk
    return received


def _http_infer(url: str) -> Any:
    client = httpclient.InferenceServerClient(url, network_timeout=10)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    return client.infer("echo", [tensor]).as_numpy("OUTPUT0")


def test_slowloris_connections_do_not_stop_normal_clients_and_are_closed(server: ServerProcess) -> None:
    request = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\nX-Slow: "
    started = time.monotonic()
    slow = [_connect(server.url) for _ in range(SLOW_CONNECTIONS)]
    rounds = 0
    try:
        # Dribble the headers a byte at a time, the slowloris way, serving a normal client between;
        # only in the first half of the read timeout, so that no byte is sent to a connection the
        # server may already have closed, however slowly the rounds go on a busy machine.
        for i in range(5):
            if time.monotonic() - started >= READ_TIMEOUT / 2:
                break
            for sock in slow:
                sock.sendall(request[i:i + 1])
            np.testing.assert_array_equal(_http_infer(server.url), np.arange(4, dtype=np.float32))
            rounds += 1
            time.sleep(0.1)
        answers = [_read_until_closed(sock, READ_TIMEOUT + 5) for sock in slow]
    finally:
        for sock in slow:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"<closed>") for answer in answers), answers[0]
    assert b"(--http-read-timeout-secs)" in answers[0]
    assert rounds >= 1, "opening the slow connections took half the read timeout"
    assert time.monotonic() - started < READ_TIMEOUT + 6
    np.testing.assert_array_equal(_http_infer(server.url), np.arange(4, dtype=np.float32))


def test_a_slow_body_is_cut_off_too(server: ServerProcess) -> None:
    sock = _connect(server.url)
    try:
        sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\nContent-Length: 100\r\n\r\n{")
        answer = _read_until_closed(sock, READ_TIMEOUT + 5)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"<closed>"), answer


def test_a_connection_that_never_sends_is_closed(server: ServerProcess) -> None:
    sock = _connect(server.url)
    try:
        assert _read_until_closed(sock, READ_TIMEOUT + 5) == b"<closed>"
    finally:
        sock.close()


def test_idle_keep_alive_connections_between_requests_are_kept(server: ServerProcess) -> None:
    """The timeout is for requests being received: a client's pooled connection may idle."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=10)
    assert client.is_server_live()
    time.sleep(READ_TIMEOUT * 1.5)
    assert client.is_server_live()


def test_a_body_declared_over_the_limit_is_refused_before_it_is_sent(server: ServerProcess) -> None:
    sock = _connect(server.url)
    try:
        sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\nContent-Length: 1000000000\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        sock.settimeout(5)
        answer = sock.recv(65536)  # no 100 Continue: the refusal, at once
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"connection: close" in answer
    assert f"exceeds the maximum allowed value of {MAX_INPUT} bytes".encode() in answer


def test_a_body_over_the_limit_sent_anyway_is_dropped_then_the_connection_closes(server: ServerProcess) -> None:
    sock = _connect(server.url)
    try:
        body = b"x" * (MAX_INPUT * 4)
        sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.settimeout(5)
        head = sock.recv(65536)  # answered before the body is sent
        assert head.startswith(b"HTTP/1.1 400 "), head
        sock.sendall(body)
        assert _read_until_closed(sock, 5).endswith(b"<closed>")
    finally:
        sock.close()
    np.testing.assert_array_equal(_http_infer(server.url), np.arange(4, dtype=np.float32))


def test_grpc_connections_that_never_finish_the_preface_are_closed(server: ServerProcess) -> None:
    slow = [_connect(server.grpc_url) for _ in range(50)]
    started = time.monotonic()
    try:
        for sock in slow:
            sock.sendall(b"PRI * HTTP/2.0\r\n")  # half a preface, then nothing
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        result = client.infer("echo", [tensor]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(result, np.arange(4, dtype=np.float32))
        answers = [_read_until_closed(sock, READ_TIMEOUT + 5) for sock in slow]
    finally:
        for sock in slow:
            sock.close()
    # Each got the server's SETTINGS, then a GOAWAY (type 7) with PROTOCOL_ERROR, then the close.
    assert all(answer.endswith(b"<closed>") for answer in answers), answers[0]
    assert b"preface and first frame not received in time" in answers[0]
    assert time.monotonic() - started < READ_TIMEOUT + 6
    client.close()


def test_timeouts_default_and_can_be_switched_off(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "echo", IDENTITY, {1: lambda path: None})
    server = start_server(["--model-repository", str(repo), "--http-read-timeout-secs=0",
                           "--grpc-handshake-timeout-secs=0"])
    sock = _connect(server.url)
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        assert _read_until_closed(sock, 1.5) == b""  # still open, still waiting
        sock.sendall(b"Host: naiad\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        sock.close()


def test_headers_past_64_kib_are_refused_with_431(server: ServerProcess) -> None:
    sock = _connect(server.url)
    answer = b""
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: naiad\r\nX-Big: ")
        try:
            for _ in range(64):  # up to 64 MiB of one header value, as fast as the socket takes it
                sock.sendall(b"a" * (1 << 20))
        except OSError:
            pass  # the server answered and closed while we were still sending
        answer = _read_until_closed(sock, 5)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"request line and headers exceed 65536 bytes" in answer


def test_headers_just_under_the_limit_are_fine(server: ServerProcess) -> None:
    sock = _connect(server.url)
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: naiad\r\nX-Big: " + b"a" * 60_000 + b"\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        sock.close()


def test_grpc_connections_that_never_finish_a_frame_are_closed(server: ServerProcess) -> None:
    """After a proper preface and SETTINGS, a frame dribbled a byte at a time is cut off too."""
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
    sock = _connect(server.grpc_url)
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings)
        begun = time.monotonic()
        for byte in b"\x00\x00\x10\x00":  # the start of a 16-byte DATA frame's head, then nothing
            if time.monotonic() - begun >= READ_TIMEOUT / 2:  # never into a connection cut off already
                break
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
        answer = _read_until_closed(sock, READ_TIMEOUT + 5)
    finally:
        sock.close()
    assert answer.endswith(b"<closed>") and b"frame not completed in time" in answer, answer
