"""GPU metrics from a real GPU through NVML (skipped without one)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from naiad.observability.gpu_metrics import load_nvml
from naiad.observability.metrics import Metrics

pytestmark = pytest.mark.gpu


def test_a_real_gpu_reports_its_families() -> None:
    if load_nvml() is None:
        pytest.skip("no NVIDIA GPU and driver")
    page = Metrics(lambda: [], cpu=False, gpu=True)
    families = {f.name: f for f in text_string_to_metric_families(page.text().decode())}
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"):
        samples = families[name].samples
        assert samples and all(s.labels["gpu_uuid"].startswith("GPU-") for s in samples)
    total = families["nv_gpu_memory_total_bytes"].samples[0].value
    assert 0 < families["nv_gpu_memory_used_bytes"].samples[0].value <= total
    assert 0.0 <= families["nv_gpu_utilization"].samples[0].value <= 1.0
