"""The response-cache families of /metrics: Triton's names, µs units, printed only for versions
the cache serves and only with the latency counters on."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from naiad.observability.metrics import ModelSample, render_models
from naiad.observability.statistics import LatencySettings, ModelStatistics

CACHE_FAMILIES = {"nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model",
                  "nv_cache_num_misses_per_model", "nv_cache_miss_duration_per_model"}


def _stats(name: str, cached: bool, latency: LatencySettings | None = None) -> ModelStatistics:
    stats = ModelStatistics(name, "1", latency=latency or LatencySettings(), cache_enabled=cached)
    stats.record_execution(1, 1_000, 2_000, 3_000)
    stats.record_request(True, 10_000, 4_000, (1_000, 2_000, 3_000))
    if cached:
        stats.record_cache_miss(2_000, 1_000)
        stats.record_cache_hit(6_000, 500, 5_000)
        stats.record_cache_hit(4_000, 500, 3_000)
    return stats


def _values(samples: list[ModelSample]) -> dict[tuple[str, str], float]:
    text = "\n".join(render_models(samples)) + "\n"
    return {(family.name, sample.labels["model"]): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if "quantile" not in sample.labels and not sample.name.endswith(("_sum", "_count"))}


def test_cache_counters_in_microseconds_for_cached_versions_only() -> None:
    values = _values([ModelSample(_stats("cached", True), 0), ModelSample(_stats("plain", False), 0)])
    assert values[("nv_cache_num_hits_per_model", "cached")] == 2
    assert values[("nv_cache_hit_duration_per_model", "cached")] == 8  # 5,000 + 3,000 ns
    assert values[("nv_cache_num_misses_per_model", "cached")] == 1
    assert values[("nv_cache_miss_duration_per_model", "cached")] == 3  # lookup + insertion
    assert not any(name in CACHE_FAMILIES for name, model in values if model == "plain")
    # Hits are successes whose time counts (with the insertion of the miss), never inferences.
    assert values[("nv_inference_request_success", "cached")] == 3
    assert values[("nv_inference_request_duration_us", "cached")] == 10 + 1 + 6 + 4
    assert values[("nv_inference_queue_duration_us", "cached")] == 5  # 4,000 + 2 x 500 ns
    assert values[("nv_inference_count", "cached")] == 1
    assert values[("nv_inference_compute_infer_duration_us", "cached")] == 2


def test_no_cache_families_without_a_cached_version() -> None:
    values = _values([ModelSample(_stats("plain", False), 0)])
    assert not {name for name, _ in values} & CACHE_FAMILIES


def test_no_cache_counters_when_latency_counters_are_off() -> None:
    # Triton makes the cache counters with the latency counters.
    values = _values([ModelSample(_stats("cached", True, LatencySettings(counters=False)), 0)])
    assert not {name for name, _ in values} & CACHE_FAMILIES
    assert values[("nv_inference_request_success", "cached")] == 3


def test_cache_summaries_replace_the_request_summary() -> None:
    stats = _stats("cached", True, LatencySettings(summaries=True))
    text = "\n".join(render_models([ModelSample(stats, 0)])) + "\n"
    families = {family.name: family for family in text_string_to_metric_families(text)}
    counts = {name: next(s.value for s in family.samples if s.name.endswith("_count"))
              for name, family in families.items() if family.type == "summary"}
    assert counts["nv_cache_hit_summary_per_model"] == 2
    assert counts["nv_cache_miss_summary_per_model"] == 1
    assert counts["nv_inference_queue_summary_us"] == 3
    assert "nv_inference_request_summary_us" not in counts
    assert "# HELP nv_cache_hit_summary_per_model Summary of cache hit duration per model, in microseconds" in text
