"""The chart's rendered container, run for real: `tritonserver` with the Deployment's args (the
repository and ports swapped for local ones), its startup/liveness/readiness probes on the ports
they name, one inference over HTTP and one over gRPC through tritonclient, the metrics the
autoscalers query, and a SIGTERM drain inside the pod's grace period."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy.pod import infer_simple_grpc, infer_simple_http, run_container, write_simple_repository
from deploy.tools import ADAPTER_VALUES, VALUES_DIR, one, render_chart

CASES = [pytest.param([], id="defaults")] + [pytest.param([p], id=p.stem) for p in sorted(VALUES_DIR.glob("*.yaml"))]


def _autoscaler_metric_names() -> set[str]:
    """Every naiad series the KEDA query and the prometheus-adapter rule read."""
    keda = one(render_chart([VALUES_DIR / "keda-podmonitor.yaml"]), "ScaledObject")
    rule = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"][0]
    text = keda["spec"]["triggers"][0]["metadata"]["query"] + rule["metricsQuery"] + rule["seriesQuery"]
    return set(re.findall(r"\bnv_\w+", text))


def _samples(metrics_url: str) -> dict[str, dict[str, float]]:
    """{metric name as exported: {model label: value}} from the live /metrics page."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        page = response.read().decode()
    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(page):
        # the parser names a counter's samples <name>_total even where the page (Triton's
        # names, which Prometheus queries use) has no suffix
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                samples.setdefault(family.name, {})[sample.labels.get("model", "")] = sample.value
    return samples


@pytest.mark.e2e
@pytest.mark.parametrize("values", CASES)
def test_rendered_container_serves_with_its_probes_and_ports(values: list[Path], tmp_path: Path) -> None:
    objects = render_chart(values)
    pod_spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    repository = write_simple_repository(tmp_path / "models")
    with run_container(container, repository, tmp_path / "naiad.log") as pod:
        pod.wait_probe("startupProbe")
        assert pod.probe("livenessProbe") == 200
        pod.wait_probe("readinessProbe", timeout=10)

        infer_simple_http(f"127.0.0.1:{pod.local_port('http')}")
        infer_simple_grpc(f"127.0.0.1:{pod.local_port('grpc')}")

        metrics_url = f"http://127.0.0.1:{pod.local_port('metrics')}/metrics"
        samples = _samples(metrics_url)
        assert samples["nv_inference_request_success"]["simple"] == 2
        assert samples["nv_inference_queue_duration_us"]["simple"] >= 0
        names = _autoscaler_metric_names()
        assert names == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
        for name in names:
            assert "simple" in samples.get(name, {}), f"{name} for model simple is not on naiad's /metrics"

        # SIGTERM as the kubelet sends it after the preStop pause: naiad drains and exits 0
        # well inside the grace period the chart derived from --exit-timeout-secs.
        grace = pod_spec["terminationGracePeriodSeconds"]
        started = time.monotonic()
        pod.process.send_signal(signal.SIGTERM)
        try:
            code = pod.process.wait(grace)
        except subprocess.TimeoutExpired:
            pytest.fail(f"naiad still running {grace}s after SIGTERM:\n{pod.logs()}")
        assert code == 0, pod.logs()
        assert time.monotonic() - started < grace
