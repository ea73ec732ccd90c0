"""The /metrics page from statistics counters: Triton's names, types, sorted labels, reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from naiad.observability.metrics import CpuSampler, Metrics, ModelSample, render_models
from naiad.observability.statistics import Histogram, LatencySettings, ModelStatistics


def _families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _stats() -> ModelStatistics:
    stats = ModelStatistics("simple", "1")
    stats.record_execution(1, 1_000, 2_000, 3_000)
    stats.record_request(True, 10_000, 4_000, (1_000, 2_000, 3_000))
    stats.record_execution(8, 1_000, 2_000, 3_000)
    stats.record_request(True, 20_000, 4_000, (1_000, 2_000, 3_000))
    stats.record_request(False, 5_000, 0, (0, 0, 0))  # BACKEND by default
    stats.record_failure(7_000, "REJECTED")
    stats.record_failure(0)  # OTHER
    return stats


def test_model_families_with_triton_names_and_values() -> None:
    text = "\n".join(render_models([ModelSample(_stats(), pending=3)])) + "\n"
    families = _families(text)
    # By family name: the parser reports a counter's samples as `<name>_total`.
    values = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    model = (("model", "simple"), ("version", "1"))
    assert values[("nv_inference_request_success", model)] == 2
    assert values[("nv_inference_count", model)] == 9
    assert values[("nv_inference_exec_count", model)] == 2
    assert values[("nv_inference_pending_request_count", model)] == 3
    assert values[("nv_inference_queue_duration_us", model)] == 8  # 2 x 4,000 ns
    assert values[("nv_inference_compute_infer_duration_us", model)] == 4
    assert values[("nv_inference_request_duration_us", model)] == 42  # success 30 us + failures 12 us
    failures = {dict(labels)["reason"]: value for (name, labels), value in values.items()
                if name == "nv_inference_request_failure"}
    assert failures == {"REJECTED": 1.0, "CANCELED": 0.0, "BACKEND": 1.0, "OTHER": 1.0}
    assert "# TYPE nv_inference_request_success counter" in text  # not renamed to *_total
    assert "# TYPE nv_inference_pending_request_count gauge" in text


def test_labels_print_sorted_as_triton_does() -> None:
    text = "\n".join(render_models([ModelSample(_stats(), pending=0)]))
    assert 'nv_inference_request_failure{model="simple",reason="REJECTED",version="1"} 1' in text
    assert 'nv_inference_request_success{model="simple",version="1"} 2' in text


def test_no_models_no_model_families() -> None:
    assert list(render_models([])) == []


def test_cpu_metrics_from_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n")
    sampler = CpuSampler(tmp_path)
    (tmp_path / "stat").write_text("cpu  200 0 200 1200 200 0 0 0 0 0\n")  # +200 busy of +800 jiffies
    families = _families("\n".join(sampler.render()) + "\n")
    assert families["nv_cpu_utilization"].samples[0].value == 0.25
    assert families["nv_cpu_memory_total_bytes"].samples[0].value == 1_024_000
    assert families["nv_cpu_memory_used_bytes"].samples[0].value == 614_400


def test_the_page_leaves_cpu_metrics_out_when_not_allowed() -> None:
    text = Metrics(lambda: [ModelSample(_stats(), 0)], cpu=False).text().decode()
    assert "nv_inference_count" in text and "nv_cpu_utilization" not in text
    assert "nv_cpu_utilization" in Metrics(lambda: [], cpu=True).text().decode()


def _latency_stats(settings: LatencySettings) -> ModelStatistics:
    stats = ModelStatistics("m", "2", latency=settings)
    for total_us in (1_000, 2_000, 3_000, 4_000):
        stats.record_request(True, total_us * 1000, 500_000, (1_000, 2_000, 3_000))
        stats.record_first_response(total_us * 1000)
    return stats


def test_summaries_and_the_histogram_only_when_turned_on() -> None:
    off = "\n".join(render_models([ModelSample(_latency_stats(LatencySettings()), 0)]))
    assert "summary" not in off and "histogram" not in off
    on = LatencySettings.from_config({"summary_latencies": "true", "histogram_latencies": "true",
                                      "counter_latencies": "false", "summary_quantiles": "0.5:0.05,0.99:0.001"})
    text = "\n".join(render_models([ModelSample(_latency_stats(on), 0)])) + "\n"
    families = _families(text)
    assert "nv_inference_request_duration_us" not in families  # counter_latencies=false
    assert "nv_inference_request_success" in families  # the other counters stay
    summary = families["nv_inference_request_summary_us"]
    assert summary.type == "summary"
    samples = {(s.name, s.labels.get("quantile")): s.value for s in summary.samples}
    assert samples[("nv_inference_request_summary_us", "0.5")] == 3_000  # of 1, 2, 3 and 4 ms
    assert samples[("nv_inference_request_summary_us", "0.99")] == 4_000
    assert samples[("nv_inference_request_summary_us_count", None)] == 4
    assert samples[("nv_inference_request_summary_us_sum", None)] == 10_000
    assert 'nv_inference_queue_summary_us{model="m",quantile="0.5",version="2"} 500.0' in text
    histogram = families["nv_inference_first_response_histogram_ms"]
    buckets = {s.labels["le"]: s.value for s in histogram.samples if s.name.endswith("_bucket")}
    assert buckets == {"100": 4, "500": 4, "2000": 4, "5000": 4, "+Inf": 4}  # all under 5 ms
    assert 'nv_inference_first_response_histogram_ms_bucket{le="100",model="m",version="2"} 4' in text


def test_histogram_buckets_count_cumulatively() -> None:
    histogram = Histogram((100.0, 500.0))
    for value in (50, 100, 101, 800):
        histogram.observe(value)
    assert histogram.cumulative() == [("100", 2), ("500", 3), ("+Inf", 4)]


@pytest.mark.parametrize(("settings", "message"), [
    ({"nonsense": "1"}, "unknown --metrics-config setting 'nonsense'"),
    ({"summary_latencies": "yes"}, "must be true or false"),
    ({"summary_quantiles": "0.5"}, "summary_quantiles must look like"),
    ({"summary_quantiles": "1.5:0.1"}, "between 0 and 1"),
])
def test_bad_metrics_config_is_refused(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LatencySettings.from_config(settings)


def test_a_model_with_unusable_tags_cannot_break_the_page_for_the_others() -> None:
    """Tags the config check refuses (a label the page sets, an invalid name) are left off if
    they ever get here, so the page stays parseable and every model's series stays on it."""
    bad = ModelStatistics("bad", "1", tags={"reason": "x", "le": "y", "my-tag": "z", "team": "a"})
    text = "\n".join(render_models([ModelSample(bad, pending=0), ModelSample(_stats(), pending=0)])) + "\n"
    samples = _families(text)["nv_inference_request_success"].samples  # type: ignore[attr-defined]
    assert {sample.labels["model"] for sample in samples} == {"bad", "simple"}
    assert next(s for s in samples if s.labels["model"] == "bad").labels == {"model": "bad", "version": "1",
                                                                           "team": "a"}
