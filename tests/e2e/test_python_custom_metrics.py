"""Custom metrics from model.py (pb_utils.MetricFamily / Metric) on a real naiad's /metrics, read
with Prometheus' own parser: Triton's custom_metrics example client, one series shared by every
model process, histograms, families created after load, clashes failing in the model, and what
happens to series when a Metric is deleted, a model process dies, a model reloads or unloads."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).parent / "metrics_models"
WAIT = 30.0  # seconds: a bound on every wait, never reached when things work
LABELS = {"model": "custom_metrics", "version": "1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(MODELS), "--model-control-mode=explicit", "--load-model=custom_metrics",
            "--load-model=metric_ops"]
    with running_server(args, tmp_path_factory.mktemp("metrics") / "naiad.log") as running:
        yield running


def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def families(server: ServerProcess) -> dict[str, Any]:
    """Every family on the page, as Prometheus' parser reads it (it raises on a broken page)."""
    return {family.name: family for family in text_string_to_metric_families(scrape(server))}


def values(server: ServerProcess, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = families(server).get(family)
    return {} if found is None else {(s.name, tuple(sorted(s.labels.items()))): s.value for s in found.samples}


def value(server: ServerProcess, family: str, labels: dict[str, str] | None = None) -> float | None:
    """The sample of a counter or gauge (the parser names a counter's sample `<family>_total`)."""
    found = values(server, family)
    key = tuple(sorted((labels or {}).items()))
    return found.get((family, key), found.get((family + "_total", key)))


def add_sub(server: ServerProcess, a: np.ndarray, b: np.ndarray) -> Any:
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return httpclient.InferenceServerClient(server.url).infer("custom_metrics", inputs, request_id="1")


def op(server: ServerProcess, **command: Any) -> dict[str, Any]:
    """One metric_ops command: {"ok": result} or {"error": the model's TritonModelException}."""
    made = httpclient.InferInput("COMMAND", [1], "BYTES")
    made.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
    result = httpclient.InferenceServerClient(server.url).infer("metric_ops", [made])
    answer: dict[str, Any] = json.loads(result.as_numpy("RESULT")[0])
    return answer


def test_the_custom_metrics_example_client_finds_its_patterns(server: ServerProcess) -> None:
    """Triton's examples/custom_metrics/client.py: infer once, then scrape."""
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    result = add_sub(server, a, b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    text = scrape(server)
    for pattern in ("# HELP requests_process_latency_ns Cumulative time spent processing requests",
                    "# TYPE requests_process_latency_ns counter",
                    'requests_process_latency_ns{model="custom_metrics",version="1"}'):
        assert pattern in text
    latency = families(server)["requests_process_latency_ns"]
    assert latency.type == "counter" and [s.labels for s in latency.samples] == [LABELS]  # no labels added
    assert latency.samples[0].value > 0
    assert "nv_inference_count" in families(server)  # the server's own families are still there


def test_model_processes_share_one_series(server: ServerProcess) -> None:
    assert value(server, "custom_metrics_processes", LABELS) == 2  # one increment by each instance
    before = value(server, "custom_metrics_requests", LABELS) or 0
    ones = np.ones(4, dtype=np.float32)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: add_sub(server, ones, ones), range(40)))
    assert value(server, "custom_metrics_requests", LABELS) == before + 40
    assert len(values(server, "custom_metrics_requests")) == 1


def test_histogram_in_triton_text_format(server: ServerProcess) -> None:
    assert op(server, op="create", key="h", name="ops_latency_seconds", description="Latency", kind="histogram",
              labels={"route": "a"}, buckets=[0.1, 1, 10]) == {"ok": None}
    for sample in (0.05, 0.5, 5, 50):
        assert op(server, op="observe", key="h", value=sample) == {"ok": None}
    page = values(server, "ops_latency_seconds")
    buckets = [page[("ops_latency_seconds_bucket", (("le", le), ("route", "a")))] for le in ("0.1", "1", "10", "+Inf")]
    assert buckets == [1, 2, 3, 4]
    assert page[("ops_latency_seconds_sum", (("route", "a"),))] == pytest.approx(55.55)
    assert page[("ops_latency_seconds_count", (("route", "a"),))] == 4
    assert families(server)["ops_latency_seconds"].type == "histogram"
    text = scrape(server)
    assert 'ops_latency_seconds_bucket{route="a",le="+Inf"} 4' in text and "# HELP ops_latency_seconds Latency" in text


def test_families_created_after_load_and_shared_across_models(server: ServerProcess) -> None:
    assert op(server, op="create", key="g", name="ops_queue_depth", description="Queue", kind="gauge",
              labels={"queue": "x"}) == {"ok": None}
    op(server, op="set", key="g", value=3)
    op(server, op="increment", key="g", value=-0.5)
    assert value(server, "ops_queue_depth", {"queue": "x"}) == 2.5
    # another model's series: value() answers with the server's (shared) value
    requests = value(server, "custom_metrics_requests", LABELS)
    assert requests is not None and requests > 0
    assert op(server, op="create", key="shared", name="custom_metrics_requests", description="other text",
              kind="counter", labels=LABELS) == {"ok": None}
    assert op(server, op="value", key="shared") == {"ok": requests}
    op(server, op="increment", key="shared", value=1000)
    assert value(server, "custom_metrics_requests", LABELS) == requests + 1000
    assert families(server)["custom_metrics_requests"].documentation == "Requests executed"  # the first stays
    assert op(server, op="delete", key="shared") == {"ok": None}
    assert value(server, "custom_metrics_requests", LABELS) == requests + 1000  # custom_metrics holds it still


def test_clashes_fail_in_the_model_and_never_break_the_scrape(server: ServerProcess) -> None:
    for name in ("nv_inference_count", "nv_custom", "naiad_requests"):
        answer = op(server, op="create", key="x", name=name, description="mine", kind="counter")
        assert "Error when creating MetricFamily" in answer["error"] and "reserved" in answer["error"]
    answer = op(server, op="create", key="x", name="ops_bad_label", kind="gauge", labels={"bad-label": "v"})
    assert "invalid label name 'bad-label'" in answer["error"]
    answer = op(server, op="create", key="x", name="ops_le", kind="histogram", labels={"le": "1"}, buckets=[1])
    assert "'le' is reserved in a histogram" in answer["error"]
    # only the server knows custom_metrics made this name a counter: the next use raises its refusal
    assert op(server, op="create", key="k", name="requests_process_latency_ns", kind="gauge") == {"ok": None}
    for command in ({"op": "set", "value": 1}, {"op": "value"}):
        answer = op(server, key="k", **command)
        assert "a metric family named 'requests_process_latency_ns' already exists with kind COUNTER" in answer["error"]
    page = families(server)  # parses
    assert page["requests_process_latency_ns"].type == "counter" and page["nv_inference_count"].type == "counter"
    assert not any(name.startswith(("ops_bad", "ops_le", "naiad_")) for name in page)
    assert {tuple(sorted(s.labels)) for s in page["nv_inference_count"].samples} == {("model", "version")}


def test_a_deleted_metric_leaves_the_page(server: ServerProcess) -> None:
    op(server, op="create", key="t", name="ops_temporary", description="t", kind="gauge")
    op(server, op="set", key="t", value=1)
    assert value(server, "ops_temporary") == 1
    op(server, op="delete", key="t")
    assert "ops_temporary" not in families(server)


def test_a_restarted_model_process_keeps_the_series_it_creates_again(server: ServerProcess) -> None:
    started = value(server, "metric_ops_processes")
    op(server, op="create", key="c", name="ops_before_crash", description="c", kind="counter")
    op(server, op="increment", key="c", value=1)
    with pytest.raises(InferenceServerException, match="is not healthy"):
        op(server, op="crash")
    deadline = time.monotonic() + WAIT
    while True:  # the next request starts a new process
        try:
            op(server, op="ping")
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.2)
    assert started is not None and value(server, "metric_ops_processes") == started + 1  # counted on, not reset
    assert "ops_before_crash" not in families(server)  # nobody created it again


def test_reload_keeps_values_and_unload_removes_the_models_series(server: ServerProcess) -> None:
    control = httpclient.InferenceServerClient(server.url)
    ones = np.ones(4, dtype=np.float32)
    add_sub(server, ones, ones)
    latency, processes = value(server, "requests_process_latency_ns", LABELS), value(
        server, "custom_metrics_processes", LABELS)
    assert latency and processes
    os.utime(MODELS / "custom_metrics" / "1" / "model.py")
    control.load_model("custom_metrics")  # the new version loads beside the old one, then the old one goes
    assert value(server, "requests_process_latency_ns", LABELS) == latency
    assert value(server, "custom_metrics_processes", LABELS) == processes + 2
    control.unload_model("custom_metrics")
    deadline = time.monotonic() + WAIT
    while "requests_process_latency_ns" in families(server):
        assert time.monotonic() < deadline, "the unloaded model's series stayed on /metrics"
        time.sleep(0.1)
    assert "custom_metrics_processes" not in families(server) and "metric_ops_processes" in families(server)
    control.load_model("custom_metrics")
    assert value(server, "custom_metrics_processes", LABELS) == 2  # a new start
