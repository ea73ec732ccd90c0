"""Triton's queue semantics on Python-backend models, as on any other backend: a request is queued
until the batch holding it starts executing, so max_queue_size, timeouts (REJECT and DELAY),
priorities, preserve_ordering and preferred batch sizes all apply. The model
(tests/e2e/queue_models/model.py) can hold its instance until the test releases it, so every
scenario is arranged by events, never by racing the clock."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

MODEL_PY = Path(__file__).parent / "queue_models" / "model.py"
WAIT = 30.0  # seconds: a bound on every wait, never reached when things work
HOLD = -1.0  # DELAY that holds the instance until the test releases it

IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "EXEC" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
MODELS = {
    "py_queue8": "max_batch_size: 8 instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                 "dynamic_batching { default_queue_policy { max_queue_size: 8 } }",
    "py_reject": "max_batch_size: 8 instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                 "dynamic_batching { default_queue_policy { default_timeout_microseconds: 200000 "
                 "timeout_action: REJECT } }",
    "py_delay": "max_batch_size: 1 instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                "dynamic_batching { default_queue_policy { default_timeout_microseconds: 200000 "
                "timeout_action: DELAY } }",
    "py_priority": "max_batch_size: 1 instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                   "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    "py_ordered": "max_batch_size: 1 instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                  "dynamic_batching { preserve_ordering: true }",
    "py_preferred": "max_batch_size: 8 instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }",
}


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("queue-marks")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, marks: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("queue-repo")
    for name, settings in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(MODEL_PY, repo / name / "1" / "model.py")
        (repo / name / "config.pbtxt").write_text(f'name: "{name}" backend: "python"\n{settings}\n{IO}')
    os.environ["NAIAD_TEST_TMP"] = str(marks)  # inherited by the server and its model processes
    try:
        with running_server(["--model-repository", str(repo)], repo.parent / "naiad.log") as running:
            yield running
    finally:
        del os.environ["NAIAD_TEST_TMP"]


def _inputs(module: Any, value: int, delay: float) -> list[Any]:
    tensors = []
    for name, array, datatype in (("IN", np.array([[value]], np.int32), "INT32"),
                                  ("DELAY", np.array([[delay]], np.float32), "FP32")):
        tensor = module.InferInput(name, [1, 1], datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _infer(server: ServerProcess, protocol: str, model: str, value: int, delay: float = 0.0,
           **options: Any) -> dict[str, int] | InferenceServerException:
    """One request; its OUT / EXEC / SIZE, or the error it got."""
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    try:
        result = module.InferenceServerClient(url).infer(model, _inputs(module, value, delay), **options)
    except InferenceServerException as error:
        return error
    return {name: int(result.as_numpy(name)[0, 0]) for name in ("OUT", "EXEC", "SIZE")}


def _wait_for(what: Callable[[], bool], message: str) -> None:
    deadline = time.monotonic() + WAIT
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


def _executions(marks: Path, model: str) -> int:
    """How many executions the model has started so far."""
    return len(list(marks.glob(f"{model}-started-*")))


def _pending(server: ServerProcess, model: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_pending_request_count":
            for sample in family.samples:
                if sample.labels.get("model") == model:
                    return int(sample.value)
    return 0


class Held:
    """A first request that occupies the model's only instance until `release()`."""

    def __init__(self, server: ServerProcess, marks: Path, model: str, protocol: str = "http") -> None:
        self.marks, self.model = marks, model
        (marks / f"release-{model}").unlink(missing_ok=True)
        executions = _executions(marks, model)
        self.pool = ThreadPoolExecutor(16)
        self.first = self.pool.submit(_infer, server, protocol, model, 0, HOLD)
        _wait_for(lambda: _executions(marks, model) > executions, f"{model} never started the held execution")

    def release(self) -> None:
        (self.marks / f"release-{self.model}").touch()

    def close(self) -> None:
        self.release()
        self.pool.shutdown(wait=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_beyond_max_queue_size_are_rejected_while_the_model_executes(
        server: ServerProcess, marks: Path, protocol: str) -> None:
    model = "py_queue8"
    held = Held(server, marks, model, protocol)
    try:
        futures = [held.pool.submit(_infer, server, protocol, model, i) for i in range(1, 11)]
        # Two are refused at once; the other eight wait in the queue (not in the model process).
        _wait_for(lambda: sum(f.done() for f in futures) == 2, "the two requests over the limit were not refused")
        _wait_for(lambda: _pending(server, model) == 8, "eight requests should be queued")
        held.release()
        results = [future.result(WAIT) for future in futures]
    finally:
        held.close()
    rejected = [r for r in results if isinstance(r, InferenceServerException)]
    served = [r for r in results if not isinstance(r, InferenceServerException)]
    assert len(rejected) == 2 and len(served) == 8
    for error in rejected:
        assert "Exceeds maximum queue size" in error.message()
        assert error.status() == ("503" if protocol == "http" else "StatusCode.UNAVAILABLE")
    assert all(r["SIZE"] == 8 for r in served)  # they waited together and ran as one batch
    assert isinstance(held.first.result(WAIT), dict)


def test_a_request_waiting_past_its_timeout_is_rejected(server: ServerProcess, marks: Path) -> None:
    held = Held(server, marks, "py_reject")
    try:
        waiting = held.pool.submit(_infer, server, "http", "py_reject", 7)
        result = waiting.result(WAIT)  # rejected after 200 ms while the instance is still held
        assert not held.first.done()
    finally:
        held.close()
    assert isinstance(result, InferenceServerException)
    assert "Request timeout expired" in result.message() and result.status() == "503"
    assert isinstance(held.first.result(WAIT), dict)  # the request that never waited ran


def test_a_delayed_request_runs_after_the_ones_that_did_not_time_out(server: ServerProcess, marks: Path) -> None:
    held = Held(server, marks, "py_delay")
    try:
        late = held.pool.submit(_infer, server, "http", "py_delay", 1)
        _wait_for(lambda: _pending(server, "py_delay") == 1, "the first request should be queued")
        time.sleep(0.4)  # its 200 ms timeout passes: DELAY moves it behind every other request
        on_time = [held.pool.submit(_infer, server, "http", "py_delay", v) for v in (2, 3)]
        _wait_for(lambda: _pending(server, "py_delay") == 3, "three requests should be queued")
        held.release()
        results = {r["OUT"]: r["EXEC"] for r in (f.result(WAIT) for f in [late, *on_time])}
    finally:
        held.close()
    assert results[1] > results[2] and results[1] > results[3]  # DELAY: not rejected, but last


def test_higher_priority_requests_run_first(server: ServerProcess, marks: Path) -> None:
    held = Held(server, marks, "py_priority")
    try:
        low = [held.pool.submit(_infer, server, "http", "py_priority", v) for v in (1, 2)]
        _wait_for(lambda: _pending(server, "py_priority") == 2, "two requests should be queued")
        high = held.pool.submit(_infer, server, "http", "py_priority", 3, priority=1)
        _wait_for(lambda: _pending(server, "py_priority") == 3, "three requests should be queued")
        held.release()
        executions = {r["OUT"]: r["EXEC"] for r in (f.result(WAIT) for f in [*low, high])}
    finally:
        held.close()
    assert executions[3] < executions[1] and executions[3] < executions[2]


def test_preserve_ordering_holds_a_fast_answer_behind_a_slow_earlier_one(server: ServerProcess) -> None:
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_infer, server, "http", "py_ordered", 1, 1.0)
        time.sleep(0.2)  # the slow one runs on one instance; the fast one gets the other
        sent = time.monotonic()
        fast = pool.submit(_infer, server, "http", "py_ordered", 2, 0.0)
        fast_result = fast.result(WAIT)
        waited = time.monotonic() - sent
        assert isinstance(slow.result(WAIT), dict) and isinstance(fast_result, dict)
    assert fast_result["EXEC"] == 1  # it ran at once, on the other instance ...
    assert waited >= 0.5  # ... and its answer waited for the slow one's (1 s, sent 0.2 s before)


def test_a_preferred_batch_size_is_sent_without_waiting_for_the_queue_delay(server: ServerProcess) -> None:
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda v: _infer(server, "http", "py_preferred", v), range(4)))
    assert all(isinstance(r, dict) and r["SIZE"] == 4 for r in results), results
    assert time.monotonic() - start < 15  # far below the 20 s max_queue_delay
