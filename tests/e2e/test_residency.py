"""Many models on one server (docs/residency.md): a request for a repository model that is not
loaded loads it and waits; under --model-memory-budget the least recently used idle models are
evicted to make room. Python models (tests/e2e/residency_models/model.py) hold a ballast written
through, so what the server accounts for is memory its model processes really hold."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from naiad.core.residency import process_tree_rss

pytestmark = pytest.mark.e2e

MODEL_PY = Path(__file__).parent / "residency_models" / "model.py"
MB = 1 << 20


def _write_model(repo: Path, name: str, offset: int, ballast_mb: int, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    shutil.copy(MODEL_PY, repo / name / "1" / "model.py")
    (repo / name / "config.pbtxt").write_text(f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "HOLD" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "ballast_mb" value: {{ string_value: "{ballast_mb}" }} }}
parameters {{ key: "offset" value: {{ string_value: "{offset}" }} }}
{extra}
""")


def _infer(url: str, model: str, hold: bool = False, label: str | None = None) -> int:
    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        inputs = [httpclient.InferInput("IN", [1], "INT32"), httpclient.InferInput("HOLD", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
        inputs[1].set_data_from_numpy(np.array([int(hold)], dtype=np.int32))
        parameters = {"version_label": label} if label else None
        return int(client.infer(model, inputs, parameters=parameters).as_numpy("OUT")[0])


def _post(url: str, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"http://{url}{path}", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _metrics(server: ServerProcess) -> dict[tuple[str, str], float]:
    """(family, model) -> value for the residency families."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("nv_model_"):  # the parser names counters' samples *_total
                values[(sample.name.removesuffix("_total"), sample.labels.get("model", ""))] = sample.value
    return values


def _states(url: str) -> dict[str, tuple[str, str]]:
    with httpclient.InferenceServerClient(url) as client:
        return {entry["name"]: (entry.get("state", ""), entry.get("reason", ""))
                for entry in client.get_model_repository_index()}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    servers: list[ServerProcess] = []

    def start(repo: Path, *args: str) -> ServerProcess:
        os.environ["NAIAD_TEST_TMP"] = str(tmp_path)
        server = ServerProcess(["--model-repository", str(repo), *args], tmp_path / f"naiad-{len(servers)}.log")
        servers.append(server)
        server.wait_live()
        return server

    yield start
    for server in servers:
        server.stop()


def _footprint(serve: Callable[..., ServerProcess], tmp_path: Path) -> int:
    """What one model of the test repository takes, measured by the server itself."""
    repo = tmp_path / "one"
    _write_model(repo, "m0", 0, 16)
    server = serve(repo, "--model-load-on-demand")
    assert _infer(server.url, "m0") == 1
    footprint = int(_metrics(server)[("nv_model_resident_bytes", "m0")])
    server.stop()
    return footprint


def test_a_random_stream_over_thirty_models_three_times_the_budget_all_succeed_within_it(
        serve: Callable[..., ServerProcess], tmp_path: Path) -> None:
    footprint = _footprint(serve, tmp_path)
    assert footprint > 16 * MB  # the ballast is in it, and the model process around it
    repo = tmp_path / "repo"
    for index in range(30):
        _write_model(repo, f"m{index}", index, 16)
    budget = 10 * footprint  # the 30 models need three times as much
    server = serve(repo, f"--model-memory-budget={budget}")
    baseline = process_tree_rss(server.process.pid)
    assert _states(server.url)["m0"] == ("", "")  # nothing loads before it is asked for

    # Skewed, as real traffic is: five models take 70 % of the requests.
    rng = random.Random(7)
    stream = [f"m{rng.randrange(5)}" if rng.random() < 0.7 else f"m{rng.randrange(5, 30)}" for _ in range(200)]
    peaks = {"accounted": 0, "rss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            metrics = _metrics(server)
            accounted = sum(v for (name, _), v in metrics.items() if name == "nv_model_resident_bytes")
            peaks["accounted"] = max(peaks["accounted"], int(accounted))
            peaks["rss"] = max(peaks["rss"], process_tree_rss(server.process.pid) - baseline)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda name: (name, _infer(server.url, name)), stream))
    finally:
        done.set()
        sampler.join()
    assert all(value == 1 + int(name[1:]) for name, value in answers)  # 100 % answered, by the right model

    metrics = _metrics(server)
    cold = sum(v for (name, _), v in metrics.items() if name == "nv_model_cold_start_count")
    evictions = sum(v for (name, _), v in metrics.items() if name == "nv_model_eviction_count")
    print(f"hit rate {1 - cold / len(stream):.2f} ({int(cold)} cold of {len(stream)}), {int(evictions)} evictions, "
          f"peak accounted {peaks['accounted'] / MB:.0f} MiB, peak RSS growth {peaks['rss'] / MB:.0f} MiB, "
          f"budget {budget / MB:.0f} MiB")
    assert evictions > 0
    assert peaks["accounted"] <= budget
    # What the processes really hold: the budget, plus what requests and the loader hold around it.
    assert peaks["rss"] <= budget + 2 * footprint
    hot = [name for name, _ in Counter(stream).most_common(3)]
    states = _states(server.url)
    assert all(states[name][0] == "READY" for name in hot), {name: states[name] for name in hot}
    assert any(reason == "evicted" for _, reason in states.values())


def test_pinned_and_busy_models_are_never_evicted_and_requests_wait_for_room(
        serve: Callable[..., ServerProcess], tmp_path: Path) -> None:
    footprint = _footprint(serve, tmp_path)
    repo = tmp_path / "repo"
    _write_model(repo, "pinned", 100, 16, 'parameters { key: "pinned" value: { string_value: "true" } }')
    _write_model(repo, "busy", 200, 16)
    for index in range(4):
        _write_model(repo, f"m{index}", index, 16)
    server = serve(repo, "--model-control-mode=explicit", "--load-model=pinned",
                   f"--model-memory-budget={int(3.5 * footprint)}")
    assert _states(server.url)["pinned"][0] == "READY"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_infer, server.url, "busy", True)
        deadline = time.monotonic() + 60
        while _states(server.url)["busy"][0] != "READY":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Room for one more: each of these evicts the one before, never the pinned or the busy one.
        for index in range(4):
            assert _infer(server.url, f"m{index}") == 1 + index
            states = _states(server.url)
            assert states["pinned"][0] == "READY" and states["busy"][0] == "READY"
        assert [states[f"m{i}"] for i in range(3)] == [("UNAVAILABLE", "evicted")] * 3
        assert not held.done()
        (tmp_path / "release-busy").touch()
        assert held.result(timeout=60) == 201


def test_unknown_models_are_still_not_found_and_explicit_unloads_free_their_room(
        serve: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_model(repo, "m0", 0, 1)
    server = serve(repo, "--model-control-mode=explicit", "--model-memory-budget=4G")
    with pytest.raises(InferenceServerException, match="unknown model: 'nothere'"):
        _infer(server.url, "nothere")
    generate = _post(server.url, "/v2/models/nothere/generate", {"IN": [1], "HOLD": [0]})
    assert generate == (404, {"error": "Request for unknown model: 'nothere' is not found"})  # as without
    assert _infer(server.url, "m0") == 1
    assert _metrics(server)[("nv_model_load_count", "m0")] == 1
    with httpclient.InferenceServerClient(server.url) as client:
        client.unload_model("m0")
        assert ("nv_model_resident_bytes", "m0") not in _metrics(server)
        assert _infer(server.url, "m0") == 1  # loads again on request
        assert client.is_model_ready("m0")
    metrics = _metrics(server)
    assert metrics[("nv_model_load_count", "m0")] == 2
    assert metrics[("nv_model_cold_start_count", "m0")] == 2
    assert metrics[("nv_model_memory_budget_bytes", "")] == 4 << 30


ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "HOLD" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "IN" value: "IN" } input_map { key: "HOLD" value: "HOLD" }
    output_map { key: "OUT" value: "mid" } },
  { model_name: "b" model_version: -1 input_map { key: "IN" value: "mid" } input_map { key: "HOLD" value: "HOLD" }
    output_map { key: "OUT" value: "OUT" } } ] }
"""


def test_poll_mode_ensembles_and_version_labels_load_on_demand(
        serve: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_model(repo, "a", 10, 1)
    _write_model(repo, "b", 100, 1)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    _write_model(repo, "labelled", 0, 1, 'version_policy: { all: {} }\n'
                 'parameters { key: "version_offset" value: { string_value: "1000" } }\n'
                 'parameters { key: "version_labels" value: { string_value: "stable=1,canary=2" } }')
    shutil.copytree(repo / "labelled" / "1", repo / "labelled" / "2")
    server = serve(repo, "--model-control-mode=poll", "--repository-poll-secs=1", "--model-memory-budget=4G")
    time.sleep(1.5)  # a poll has run: it loads nothing that no request asked for
    assert all(state == ("", "") for state in _states(server.url).values())

    assert _infer(server.url, "ens") == 1 + 10 + 100  # the ensemble's steps load with it
    states = _states(server.url)
    assert states["a"][0] == states["b"][0] == states["ens"][0] == "READY"
    assert _metrics(server)[("nv_model_load_count", "ens")] == 1

    assert _infer(server.url, "labelled", label="canary") == 1 + 2000  # the label routes it once loaded
    assert _infer(server.url, "labelled", label="stable") == 1 + 1000

    shutil.rmtree(repo / "labelled")  # gone from the repository: the poll unloads it
    deadline = time.monotonic() + 30
    while ("nv_model_resident_bytes", "labelled") in _metrics(server):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "labelled" not in _states(server.url)


def test_generate_waits_for_a_cold_model_as_infer_does(serve: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """/generate decodes by the model's inputs, so it waits for the load before decoding."""
    repo = tmp_path / "repo"
    _write_model(repo, "m0", 41, 1)
    server = serve(repo, "--model-load-on-demand")
    status, answer = _post(server.url, "/v2/models/m0/generate", {"IN": [1], "HOLD": [0]})
    assert (status, answer["OUT"]) == (200, 42)
    assert _metrics(server)[("nv_model_load_count", "m0")] == 1
