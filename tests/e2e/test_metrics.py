"""/metrics on --metrics-port after known traffic, read with Prometheus' own text parser:
Triton's worked examples (batch-1 + batch-8 → success 2, count 9, exec 2; dynamically batched
together → exec 1), failure reasons, the pending gauge, label order, and the flags."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from e2e.concurrency import in_threads
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

MODEL = """
name: "{name}"
backend: "identity"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay}" }} }}
{batching}
"""
MODELS = {
    "plain": ("0", ""),
    # The two requests arrive within the delay and make exactly the preferred 9 rows.
    "batched": ("0", "dynamic_batching { preferred_batch_size: [ 9 ] max_queue_delay_microseconds: 2000000 }"),
    "overflow": ("500", "dynamic_batching { default_queue_policy { max_queue_size: 1 } }"),
    # Custom labels, and its own first-response buckets (Triton's per-model override).
    "tagged": ("0", 'metric_tags { key: "team" value: "search" } model_metrics { metric_control [ {'
                    ' metric_identifier { family: "nv_inference_first_response_histogram_ms" }'
                    ' histogram_options { buckets: [ 1, 10 ] } } ] }'),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("metrics")
    for name, (delay, batching) in MODELS.items():
        write_model(repo, name, MODEL.format(name=name, delay=delay, batching=batching), {1: lambda path: None})
    return repo


def _infer(url: str, model: str, rows: int, columns: int = 4) -> None:
    tensor = httpclient.InferInput("INPUT0", [rows, columns], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, columns), dtype=np.float32))
    with httpclient.InferenceServerClient(url) as client:
        client.infer(model, [tensor])


def _scrape(server: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return answer.read().decode()


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    # By family name: the parser reports a counter's samples as `<name>_total`.
    return {(family.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _model(name: str) -> tuple[tuple[str, str], ...]:
    return (("model", name), ("version", "1"))


def test_counts_after_known_traffic(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo)])
    _infer(server.url, "plain", 1)
    _infer(server.url, "plain", 8)
    in_threads(lambda: _infer(server.url, "batched", 1), lambda: _infer(server.url, "batched", 8))
    with pytest.raises(InferenceServerException):
        _infer(server.url, "plain", 1, columns=3)  # a wrong shape fails validation: reason OTHER
    text = _scrape(server)
    values = _values(text)
    assert values[("nv_inference_request_success", _model("plain"))] == 2
    assert values[("nv_inference_count", _model("plain"))] == 9
    assert values[("nv_inference_exec_count", _model("plain"))] == 2
    assert values[("nv_inference_request_success", _model("batched"))] == 2
    assert values[("nv_inference_count", _model("batched"))] == 9
    assert values[("nv_inference_exec_count", _model("batched"))] == 1
    failure = "nv_inference_request_failure"
    assert values[(failure, (("model", "plain"), ("reason", "OTHER"), ("version", "1")))] == 1
    assert values[(failure, (("model", "plain"), ("reason", "BACKEND"), ("version", "1")))] == 0
    # Triton prints labels sorted, and QA scripts grep for exactly this.
    assert 'nv_inference_request_failure{model="plain",reason="OTHER",version="1"} 1' in text
    assert values[("nv_inference_request_duration_us", _model("plain"))] > 0
    assert values[("nv_inference_queue_duration_us", _model("batched"))] > 0
    assert 0 < values[("nv_model_load_duration_secs", _model("plain"))] < 60
    assert 0 <= values[("nv_cpu_utilization", ())] <= 1
    assert values[("nv_cpu_memory_total_bytes", ())] >= values[("nv_cpu_memory_used_bytes", ())] > 0


def test_a_full_queue_counts_as_rejected_and_shows_as_pending(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo)])
    outcomes: list[str] = []
    seen_pending: list[float] = []

    def call() -> None:
        try:
            _infer(server.url, "overflow", 1)
            outcomes.append("ok")
        except InferenceServerException:
            outcomes.append("rejected")

    def watch() -> None:
        for _ in range(20):
            seen_pending.append(_values(_scrape(server))[("nv_inference_pending_request_count", _model("overflow"))])
            time.sleep(0.05)

    in_threads(call, call, call, watch)
    rejected = outcomes.count("rejected")
    assert rejected >= 1  # one executes, one waits in the queue of 1, the rest are turned away
    values = _values(_scrape(server))
    reason = (("model", "overflow"), ("reason", "REJECTED"), ("version", "1"))
    assert values[("nv_inference_request_failure", reason)] == rejected
    assert max(seen_pending) == 1  # the one that waited behind the executing request
    assert values[("nv_inference_pending_request_count", _model("overflow"))] == 0


def test_cpu_metrics_can_be_turned_off(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--allow-cpu-metrics=false"])
    text = _scrape(server)
    assert "nv_inference_count" in text and "nv_cpu_utilization" not in text


def test_metrics_can_be_turned_off(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--allow-metrics=false"])
    with pytest.raises(urllib.error.URLError):
        _scrape(server)


def test_only_metrics_is_served_on_the_metrics_port(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo)])
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/v2/health/ready", timeout=10)
    assert error.value.code == 404


def test_a_metrics_port_in_use_is_a_start_up_error(repo: Path, start_server: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server(["--model-repository", str(repo), "--metrics-port", str(port)], wait=False)
        assert server.process.wait(60) == 1
    assert "failed to start Metrics service" in server.logs()


def test_metrics_config_turns_summaries_and_the_histogram_on(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--metrics-config", "summary_latencies=true",
                           "--metrics-config", "histogram_latencies=true", "--metrics-config=counter_latencies=false"])
    for _ in range(3):
        _infer(server.url, "plain", 2)
    families = {family.name: family for family in text_string_to_metric_families(_scrape(server))}
    assert "nv_inference_queue_duration_us" not in families
    counts = {s.labels["model"]: s.value for s in families["nv_inference_request_summary_us"].samples
              if s.name.endswith("_count")}
    assert counts["plain"] == 3
    quantiles = {s.labels["quantile"] for s in families["nv_inference_compute_infer_summary_us"].samples
                 if "quantile" in s.labels and s.labels["model"] == "plain"}
    assert quantiles == {"0.5", "0.9", "0.95", "0.99", "0.999"}
    buckets = [s for s in families["nv_inference_first_response_histogram_ms"].samples
               if s.name.endswith("_bucket") and s.labels["model"] == "plain"]
    assert [s.labels["le"] for s in buckets] == ["100", "500", "2000", "5000", "+Inf"]
    assert buckets[-1].value == 3


def test_by_default_no_summaries_or_histograms(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo)])
    _infer(server.url, "plain", 1)
    text = _scrape(server)
    assert "_summary_us" not in text and "histogram" not in text
    assert "nv_inference_compute_infer_duration_us" in text


def test_an_unknown_metrics_config_setting_is_a_usage_error(repo: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(repo),
                           "--metrics-config", "quantum_latencies=true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown --metrics-config setting 'quantum_latencies'" in done.stderr


def test_metric_tags_and_per_model_buckets(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--metrics-config", "histogram_latencies=true"])
    _infer(server.url, "tagged", 1)
    _infer(server.url, "plain", 1)
    text = _scrape(server)
    # Tags print among the labels, sorted with them.
    assert 'nv_inference_count{model="tagged",team="search",version="1"} 1' in text
    assert 'nv_inference_count{model="plain",version="1"} 1' in text
    (histogram,) = [family for family in text_string_to_metric_families(text)
                    if family.name == "nv_inference_first_response_histogram_ms"]
    bounds: dict[str, list[str]] = {}
    for sample in histogram.samples:
        if sample.name.endswith("_bucket"):
            bounds.setdefault(sample.labels["model"], []).append(sample.labels["le"])
    assert bounds["tagged"] == ["1", "10", "+Inf"]
    assert bounds["plain"] == ["100", "500", "2000", "5000", "+Inf"]
