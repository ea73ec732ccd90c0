"""Draining on SIGTERM over gRPC: an in-flight ModelInfer finishes, the health check turns
NOT_SERVING meanwhile, and an idle open stream does not hold the exit (SPEC §7)."""

from __future__ import annotations

import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import SLOW_CONFIG, slow
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e


def _slow(client: grpcclient.InferenceServerClient, trips: int) -> float:
    tensor = grpcclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([trips], np.int64))
    started = time.monotonic()
    client.infer("slow", [tensor], client_timeout=60)
    return time.monotonic() - started


def _health(url: str) -> int:
    with grpc.insecure_channel(url) as channel:
        try:
            return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status)
        except grpc.RpcError:
            return -1


def test_sigterm_drains_grpc_requests_and_closes_idle_streams(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "slow"
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    server = start_server(["--model-repository", str(repo), "--exit-timeout-secs=20"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    trips = max(1000, int(1000 * 1.5 / max(_slow(client, 1000), 1e-3)))
    stream_events: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: stream_events.put(error))  # open, idle
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as other:
            try:
                outcome["seconds"] = _slow(other, trips)
            except Exception as error:
                outcome["error"] = error

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.3)  # let the request reach the model
    server.process.send_signal(signal.SIGTERM)
    health = []
    while thread.is_alive():
        health.append(_health(server.grpc_url))
        time.sleep(0.05)
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    assert health_pb2.HealthCheckResponse.NOT_SERVING in health
    assert server.process.wait(20) == 0
    client.stop_stream()
    client.close()


def test_deadlines_and_cancelled_streams_leave_the_server_serving(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "slow"
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    server = start_server(["--model-repository", str(repo)])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        trips = max(1000, int(1000 * 1.0 / max(_slow(client, 1000), 1e-3)))
        tensor = grpcclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([trips], np.int64))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("slow", [tensor], client_timeout=0.2)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("slow", [tensor], request_id="left")
        time.sleep(0.2)
        client.stop_stream(cancel_requests=True)  # the client goes away mid-request
        assert _slow(client, 1000) < 30  # and the server still answers
        assert client.get_inference_statistics("slow").model_stats[0].inference_count >= 2



def test_a_unary_call_that_ends_while_queued_is_never_executed(tmp_path: Path, start_server: Any) -> None:
    """A ModelInfer whose deadline passes while it waits in the queue is dropped, not run for
    nobody (naiad answers unary calls without a task: the call's end must still reach its
    queued request)."""
    from e2e.scaling_util import wait_pending

    repo = tmp_path / "slow"
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    server = start_server(["--model-repository", str(repo)])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        trips = max(1000, int(1000 * 2.0 / max(_slow(client, 1000), 1e-3)))  # about 2 s of compute
        long = grpcclient.InferInput("N", [1], "INT64").set_data_from_numpy(np.array([trips], np.int64))
        before = client.get_inference_statistics("slow").model_stats[0].inference_count
        busy = [threading.Thread(target=client.infer, args=("slow", [long]), kwargs={"client_timeout": 120})
                for _ in range(2)]
        for thread in busy:
            thread.start()
        wait_pending(server.metrics_port, "slow", 1)  # one runs on the one instance, one waits
        with pytest.raises(InferenceServerException) as caught:
            client.infer("slow", [long], client_timeout=0.3)  # waits behind both
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        _slow(client, 1000)  # queued after all of them on the one instance: it answers once they are done
        for thread in busy:
            thread.join(120)
        # the two long ones and the last; the expired one never ran
        assert client.get_inference_statistics("slow").model_stats[0].inference_count == before + 3
