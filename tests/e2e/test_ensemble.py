"""Ensembles in a real server through tritonclient HTTP and gRPC: a DAG of ONNX, identity and
decoupled steps; only the steps needed for the requested outputs run; independent branches run
at once (their traces overlap, each under the ensemble's trace); step errors name the step;
decoupled steps stream through later steps; loading an ensemble loads its composing models."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from pathlib import Path
from typing import Any

import build_models
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

WAIT = 30

ADD_SUB = """
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SLOW = """
name: "{name}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "300" }} }}
"""
REPEAT = """
name: "repeat"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
ECHO_INT = """
name: "echo_int"
backend: "identity"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# SUM = A + B, DIFF = A - B; then TWICE_A = SUM + DIFF, TWICE_B = SUM - DIFF.
DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "TWICE_B" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
  { model_name: "add_sub" model_version: 1
    input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "DIFF" }
    output_map { key: "OUTPUT0" value: "TWICE_A" } output_map { key: "OUTPUT1" value: "TWICE_B" } }
] }
"""
BRANCHES = """
name: "branches"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "LEFT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "RIGHT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "slow_left" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "LEFT" } },
  { model_name: "slow_right" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "RIGHT" } }
] }
"""
# Any shape goes in, the composing model takes [4] only: its error surfaces, naming the step.
LOOSE = """
name: "loose"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub"
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
"""
STREAMED = """
name: "streamed"
platform: "ensemble"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "VALUES" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "ECHOED" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { max_inflight_requests: 2 step [
  { model_name: "repeat" input_map { key: "IN" value: "VALUES" } output_map { key: "OUT" value: "ONE" } },
  { model_name: "echo_int" input_map { key: "IN" value: "ONE" } output_map { key: "OUT" value: "ECHOED" } }
] }
"""
BROKEN = """
name: "broken"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" input_map { key: "INPUT0" value: "A" } input_map { key: "NOPE" value: "A" }
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
"""


def _write_repo(repo: Path, ensembles: dict[str, str]) -> None:
    write_model(repo, "add_sub", ADD_SUB, {1: lambda p: build_models.add_sub(p, dtype=1, dims=(4,))})
    for name in ("slow_left", "slow_right"):
        write_model(repo, name, SLOW.format(name=name), {1: lambda p: None})
    write_model(repo, "repeat", REPEAT, {1: lambda p: None})
    write_model(repo, "echo_int", ECHO_INT, {1: lambda p: None})
    for name, config in ensembles.items():
        write_model(repo, name, config, {1: lambda p: None})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import running_server

    repo = tmp_path_factory.mktemp("ensembles")
    _write_repo(repo, {"diamond": DIAMOND, "branches": BRANCHES, "loose": LOOSE, "streamed": STREAMED})
    traces = repo / "traces.json"
    args = ["--model-repository", str(repo), "--trace-config", f"triton,file={traces}",
            "--trace-config", "triton,log-frequency=1", "--trace-config", "rate=1",
            "--trace-config", "level=TIMESTAMPS"]
    with running_server(args, repo / "naiad.log") as running:
        running.traces = traces
        yield running


def _inputs(module: Any, names: tuple[str, ...], arrays: list[np.ndarray]) -> list[Any]:
    tensors = []
    for name, array in zip(names, arrays, strict=True):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _executions(url: str, model: str) -> int:
    with httpclient.InferenceServerClient(url) as client:
        return int(client.get_inference_statistics(model)["model_stats"][0]["execution_count"])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_diamond_computes_through_both_steps(server: Any, module: Any) -> None:
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)
    b = np.array([[4, 3, 2, 1], [1, 1, 1, 1]], dtype=np.float32)
    url = server.url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        result = client.infer("diamond", _inputs(module, ("A", "B"), [a, b]))
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("TWICE_B"), 2 * b)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_only_the_steps_for_the_requested_outputs_run(server: Any, module: Any) -> None:
    a = np.ones((1, 4), dtype=np.float32)
    before = _executions(server.url, "add_sub")
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    try:
        result = client.infer("diamond", _inputs(module, ("A", "B"), [a, a]),
                              outputs=[module.InferRequestedOutput("SUM")])
        assert result.as_numpy("TWICE_A") is None
        np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)
        assert _executions(server.url, "add_sub") == before + 1  # the second step never ran
        client.infer("diamond", _inputs(module, ("A", "B"), [a, a]))
        assert _executions(server.url, "add_sub") == before + 3
    finally:
        client.close()
    with httpclient.InferenceServerClient(server.url) as stats_client:
        stats = stats_client.get_inference_statistics("diamond")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 2


def test_independent_branches_run_at_once_and_join_the_ensemble_trace(server: Any) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("branches", _inputs(httpclient, ("X",), [x]), request_id="fork")
    np.testing.assert_array_equal(result.as_numpy("LEFT"), x)
    np.testing.assert_array_equal(result.as_numpy("RIGHT"), x)
    deadline = time.monotonic() + WAIT
    while True:  # the ensemble's trace is written once its reply went out, just after the client has it
        traces = _read_traces(server.traces)
        parents = [t for t in traces.values() if t.get("model_name") == "branches" and t["request_id"] == "fork"]
        if (parents and "stamps" in parents[0]) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (parent,) = parents
    children = [t for t in traces.values() if t["parent_id"] == parent["id"]]
    assert sorted(c["model_name"] for c in children) == ["slow_left", "slow_right"]
    left, right = (dict(c["stamps"]) for c in sorted(children, key=lambda c: c["model_name"]))
    # Each step holds its instance 300 ms: overlapping compute means the branches ran concurrently.
    assert left["COMPUTE_START"] < right["COMPUTE_END"] and right["COMPUTE_START"] < left["COMPUTE_END"]
    assert parent["stamps"][0][1] <= min(left["REQUEST_START"], right["REQUEST_START"])


def _read_traces(first: Path) -> dict[int, dict[str, Any]]:
    """Every trace written so far (log-frequency=1: one file per trace, `<file>.<n>`)."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(first.parent.glob(first.name + ".*")):
        for item in json.loads(path.read_text()):
            entry = found.setdefault(item["id"], {"id": item["id"]})
            if "timestamps" in item:
                entry["stamps"] = [(s["name"], s["ns"]) for s in item["timestamps"]]
            else:
                entry.update(item)
    return found


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_failing_step_fails_the_ensemble_with_its_name(server: Any, module: Any) -> None:
    wrong = np.ones((1, 5), dtype=np.float32)
    url = server.url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("loose", _inputs(module, ("A", "B"), [wrong, wrong]))
        # The server still serves the ensemble afterwards.
        right = np.ones((1, 4), dtype=np.float32)
        np.testing.assert_array_equal(client.infer("loose", _inputs(module, ("A", "B"), [right, right]))
                                      .as_numpy("SUM"), 2 * right)
    finally:
        client.close()
    message = str(raised.value)
    assert "in ensemble 'loose', step 0 (model 'add_sub') failed" in message
    assert "INPUT0" in message  # the composing model's own reason follows
    # The step was refused before it ran (OTHER for add_sub too); a failed ensemble counts as OTHER.
    failures = _failures(server)
    assert failures[("loose", "OTHER")] >= 1 and failures[("loose", "BACKEND")] == 0


def _failures(server: Any) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=WAIT) as page:
        text = page.read().decode()
    return {(sample.labels["model"], sample.labels["reason"]): sample.value
            for family in text_string_to_metric_families(text) if family.name == "nv_inference_request_failure"
            for sample in family.samples}


def test_a_decoupled_step_streams_through_the_next_step(server: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        values = np.array([7, 8, 9, 10, 11], dtype=np.int32)
        tensor = grpcclient.InferInput("VALUES", [5], "INT32")
        tensor.set_data_from_numpy(values)
        client.async_stream_infer("streamed", [tensor], request_id="s",
                                  enable_empty_final_response=True)
        seen = []
        while True:
            result, error = answers.get(timeout=WAIT)
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("ECHOED") is not None:
                seen.append(int(result.as_numpy("ECHOED")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert sorted(seen) == [7, 8, 9, 10, 11]


def test_ensemble_load_failures_name_the_problem(tmp_path: Path) -> None:
    from conftest import running_server

    _write_repo(tmp_path, {"broken": BROKEN, "diamond": DIAMOND})
    args = ["--model-repository", str(tmp_path), "--model-control-mode", "explicit"]
    with running_server(args, tmp_path / "naiad.log") as running, \
            httpclient.InferenceServerClient(running.url) as client:
        assert not client.is_model_ready("add_sub")
        client.load_model("diamond")  # loads its composing model too
        assert client.is_model_ready("diamond") and client.is_model_ready("add_sub")
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("broken")
        assert "model 'add_sub' has no input 'NOPE'" in str(raised.value)
        assert not client.is_model_ready("broken")
        client.unload_model("diamond")  # without unload_dependents its steps stay
        assert client.is_model_ready("add_sub")
        client.load_model("diamond")
        client.unload_model("diamond", unload_dependents=True)
        assert not client.is_model_ready("diamond") and not client.is_model_ready("add_sub")
