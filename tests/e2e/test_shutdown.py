"""Graceful shutdown of a real server (SIGTERM): requests in flight on the identity backend
(`execute_delay_ms`) complete, new HTTP connections are refused and new gRPC calls answered
UNAVAILABLE, the exit is 0 within
--exit-timeout-secs; requests still running at the timeout fail cleanly; a second SIGTERM stops
waiting. test_lifecycle.py has the drain-to-zero and timeout-exit-status cases on a slow ONNX model."""

from __future__ import annotations

import http.client
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from e2e.repo_builder import write_model
from e2e.scaling_util import wait_pending

DELAYED = """
name: "delayed"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay}" }} }}
"""
VALUES = np.arange(4, dtype=np.float32)
BODY = b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[0,1,2,3]}]}'  # raw HTTP


def _repo(tmp_path: Path, delay_ms: int, instances: int = 2) -> Path:
    repo = tmp_path / "repo"
    write_model(repo, "delayed", DELAYED.format(delay=delay_ms, instances=instances), {1: lambda path: None})
    return repo


def _http_infer(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(VALUES)
    return client.infer("delayed", [tensor]).as_numpy("OUTPUT0")


def _grpc_infer(url: str, timeout: float = 60) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(VALUES)
    try:
        return client.infer("delayed", [tensor], client_timeout=timeout).as_numpy("OUTPUT0")
    finally:
        client.close()


def _in_flight(pool: ThreadPoolExecutor, server: Any) -> list[Future[np.ndarray]]:
    """Two HTTP and two gRPC requests on the model's two instances: once two of them are queued,
    the server has all four (two run, two wait their turn)."""
    futures = [pool.submit(_http_infer, server.url), pool.submit(_http_infer, server.url),
               pool.submit(_grpc_infer, server.grpc_url), pool.submit(_grpc_infer, server.grpc_url)]
    wait_pending(server.metrics_port, "delayed", 2)
    assert not any(f.done() for f in futures), [f.result() for f in futures if f.done()]
    return futures


def _refused(url: str) -> bool:
    host, port = url.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        return False  # it reached the backlog as the listener closed: the next try is refused
    return False


def _refused_soon(url: str, timeout: float = 10.0) -> bool:
    """Whether new connections are refused within `timeout` (the signal takes a moment to land)."""
    deadline = time.monotonic() + timeout
    while not _refused(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sigterm_completes_in_flight_requests_refuses_new_connections_and_exits_zero(
        tmp_path: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(_repo(tmp_path, 2000)), "--exit-timeout-secs=20"])
    kept = http.client.HTTPConnection(server.url, timeout=30)  # a keep-alive connection opened before
    kept.request("GET", "/v2/health/live")
    live = kept.getresponse()
    live.read()
    assert live.status == 200
    with ThreadPoolExecutor(4) as pool:
        futures = _in_flight(pool, server)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert _refused_soon(server.url)  # while the four drain
        kept.request("POST", "/v2/models/delayed/infer", BODY)
        answer = kept.getresponse()
        assert answer.status == 503 and b"shutting down" in answer.read()
        kept.close()
        # gRPC keeps its listener (health answers NOT_SERVING while draining) but takes no new call.
        with pytest.raises(InferenceServerException, match="shutting down and accepts no new inference"):
            _grpc_infer(server.grpc_url)
        for future in futures:
            np.testing.assert_array_equal(future.result(timeout=30), VALUES)
    assert server.process.wait(20) == 0
    assert time.monotonic() - signalled < 20
    assert "Exit timeout expired" not in server.logs()


def test_requests_still_running_at_the_exit_timeout_fail_cleanly(tmp_path: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(_repo(tmp_path, 8000)), "--exit-timeout-secs=1"])
    with ThreadPoolExecutor(4) as pool:
        futures = _in_flight(pool, server)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) == 1  # as Triton: "Exit timeout expired. Exiting immediately."
        exited = time.monotonic() - signalled
        for future in futures:
            # Each client hears at once that its request is lost (connection closed or reset,
            # gRPC UNAVAILABLE / CANCELLED): none waits for the 8 s execution or hangs.
            with pytest.raises(Exception):  # noqa: B017 - HTTP and gRPC clients raise their own kinds
                future.result(timeout=10)
    assert exited < 4  # the 1 s timeout, plus stopping and interpreter exit
    assert time.monotonic() - signalled < 10
    assert "Exit timeout expired. Exiting immediately." in server.logs()


def test_a_second_sigterm_stops_waiting(tmp_path: Path, start_server: Any) -> None:
    """Triton ignores a second signal and waits out --exit-timeout-secs; naiad stops at once."""
    server = start_server(["--model-repository", str(_repo(tmp_path, 20000)), "--exit-timeout-secs=60"])
    with ThreadPoolExecutor(4) as pool:
        futures = _in_flight(pool, server)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.process.poll() is None  # draining: the first signal alone waits
        second = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) == 1  # requests were abandoned
        assert time.monotonic() - second < 4
        for future in futures:
            with pytest.raises(Exception):  # noqa: B017
                future.result(timeout=10)


def test_requests_whose_clients_left_while_queued_do_not_hold_up_the_exit(tmp_path: Path, start_server: Any) -> None:
    """An HTTP client that hangs up and a gRPC call whose deadline passes, both queued behind a
    running request: their requests leave the queue unanswered. Once the running one is
    answered nothing is in flight, and SIGTERM exits at once. (They stayed counted in flight, so
    every graceful stop after such a client waited out the whole --exit-timeout-secs.)"""
    server = start_server(["--model-repository", str(_repo(tmp_path, 1500, instances=1)), "--exit-timeout-secs=60"])
    request = (b"POST /v2/models/delayed/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(BODY)) + BODY
    host, port = server.url.rsplit(":", 1)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_http_infer, server.url)
        time.sleep(0.3)  # some 10x a request's arrival on a busy machine: it runs, the next two queue
        with socket.create_connection((host, int(port))) as leaving:
            leaving.sendall(request)
            wait_pending(server.metrics_port, "delayed", 1)
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            _grpc_infer(server.grpc_url, timeout=0.3)
        wait_pending(server.metrics_port, "delayed", 0)  # both left the queue
        np.testing.assert_array_equal(running.result(timeout=30), VALUES)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0
    assert time.monotonic() - signalled < 10  # nothing to drain: not the 60 s exit timeout
    assert "draining 0 in-flight inference(s)" in server.logs()
