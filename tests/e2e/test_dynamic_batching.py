"""The dynamic batcher in a real server: the identity backend holds its one instance busy for
`execute_delay_ms`, and what the batcher did is read back from the statistics extension."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from e2e.concurrency import in_threads
from e2e.raw_http import post_json
from e2e.repo_builder import write_model
from e2e.scaling_util import wait_pending

MODEL = """
name: "{name}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay}" }} }}
dynamic_batching {{ {batching} }}
"""
# "preferred" waits up to half a minute for a preferred size: a batch that goes at once cannot be
# mistaken for one that waited, and two requests sent apart still meet, however busy the machine.
LONG_DELAY_S = 30
# "cancel" holds its instance long enough for a second request to be sent, queue and be left.
CANCEL_EXECUTE_MS = 1500
MODELS = {
    "preferred": ("0", f"preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: {LONG_DELAY_S * 10**6}"),
    "lone": ("0", "preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: 600000"),
    "overflow": ("400", "default_queue_policy { max_queue_size: 1 }"),
    "timeout": ("400", "default_queue_policy { default_timeout_microseconds: 100000 }"),
    "override": ("400", "default_queue_policy { allow_timeout_override: true }"),
    "cancel": (str(CANCEL_EXECUTE_MS), ""),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import running_server

    repo = tmp_path_factory.mktemp("batching")
    for name, (delay, batching) in MODELS.items():
        write_model(repo, name, MODEL.format(name=name, delay=delay, batching=batching), {1: lambda path: None})
    with running_server(["--model-repository", str(repo)], repo / "naiad.log") as running:
        yield running


def _infer(url: str, model: str, rows: int, **kwargs: Any) -> np.ndarray:
    data = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    tensor = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
    tensor.set_data_from_numpy(data)
    with httpclient.InferenceServerClient(url) as client:
        result = client.infer(model, [tensor], **kwargs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    return data


def _batches(url: str, model: str) -> dict[int, int]:
    with httpclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_preferred_sizes_go_at_once_and_two_single_requests_form_one_batch(server: Any) -> None:
    start = time.monotonic()
    _infer(server.url, "preferred", 2)
    _infer(server.url, "preferred", 6)
    assert time.monotonic() - start < LONG_DELAY_S  # neither waited for the queue delay
    in_threads(lambda: _infer(server.url, "preferred", 1), lambda: _infer(server.url, "preferred", 1))
    assert _batches(server.url, "preferred") == {2: 2, 6: 1}


def test_a_lone_request_waits_the_whole_queue_delay(server: Any) -> None:
    start = time.monotonic()
    _infer(server.url, "lone", 1)
    assert time.monotonic() - start >= 0.6
    assert _batches(server.url, "lone") == {1: 1}


def test_queue_overflow_rejects_exactly_the_overflowing_request(server: Any) -> None:
    results = in_threads(*[lambda: _infer(server.url, "overflow", 8)] * 3)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], InferenceServerException)
    assert errors[0].status() == "503" and "Exceeds maximum queue size" in errors[0].message()


def _one_ran_one_timed_out(results: list[Any]) -> None:
    """One request ran; the other, queued behind its 400 ms execution, expired after 100 ms
    (whichever of the two the server happened to receive first)."""
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], InferenceServerException), results
    assert errors[0].status() == "503" and "Request timeout expired" in errors[0].message()


def test_a_request_past_its_queue_timeout_is_rejected(server: Any) -> None:
    _one_ran_one_timed_out(in_threads(lambda: _infer(server.url, "timeout", 8),
                                      lambda: _infer(server.url, "timeout", 8)))
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("timeout")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1


def test_request_timeout_parameter_applies_when_the_policy_allows_it(server: Any) -> None:
    # The policy sets no timeout: only the requests' own `timeout` can expire the queued one.
    _one_ran_one_timed_out(in_threads(lambda: _infer(server.url, "override", 8, timeout=100_000),
                                      lambda: _infer(server.url, "override", 8, timeout=100_000)))


def test_priority_must_be_an_unsigned_integer(server: Any) -> None:
    request = {"parameters": {"priority": "high"},
               "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": [0.0] * 8}]}
    answer = post_json(server.url, "/v2/models/preferred/infer", request)
    assert answer.status == 400
    assert "priority" in answer.error()
    _infer(server.url, "preferred", 2, priority=1)


RATE_LIMITED = """
name: "limited"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
parameters { key: "execute_delay_ms" value { string_value: "300" } }
"""


def test_rate_limiter_lets_only_one_of_two_instances_run_at_a_time(tmp_path: Path, start_server: Any) -> None:
    write_model(tmp_path, "limited", RATE_LIMITED, {1: lambda path: None})
    server = start_server(["--model-repository", str(tmp_path), "--rate-limit=execution_count",
                           "--rate-limit-resource=R:1"])
    start = time.monotonic()
    results = in_threads(lambda: _infer(server.url, "limited", 1), lambda: _infer(server.url, "limited", 1))
    assert not any(isinstance(r, Exception) for r in results), results
    assert time.monotonic() - start >= 0.6  # two 300 ms executions, one after the other
    assert _batches(server.url, "limited") == {1: 2}


def test_a_client_that_disconnects_takes_its_queued_request_out_of_the_queue(server: Any) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [8, 4], "data": [0.0] * 32}]})
    request = (f"POST /v2/models/cancel/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
               f"{body}").encode()
    host, port = server.url.rsplit(":", 1)

    def send_and_leave() -> None:
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(request)
            wait_pending(server.metrics_port, "cancel", 1)  # queued behind the running request

    # The running request is sent 0.3 s ahead (some 10x a request's arrival on a busy machine) and
    # holds the instance for 1.5 s, so the one left behind queues while it runs.
    results = in_threads(lambda: _infer(server.url, "cancel", 8), send_and_leave, stagger=0.3)
    assert not isinstance(results[0], Exception), results
    _infer(server.url, "cancel", 8)  # queued after anything still waiting, so it finishes last
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("cancel")["model_stats"][0]
    assert stats["execution_count"] == 2  # the abandoned request never ran
    assert stats["inference_stats"]["fail"]["count"] == 1
