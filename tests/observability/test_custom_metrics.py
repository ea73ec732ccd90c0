"""The server-wide registry of the metric families models create: one series per family and
labels whoever creates it, values summed over holders, series gone with their last holder, names
that would clash refused, and a page Prometheus' own parser reads."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from naiad.observability.custom_metrics import CustomMetricError, CustomMetrics
from naiad.observability.metrics import Metrics


def parse(registry: CustomMetrics) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families("\n".join(registry.render()) + "\n")}


def samples(registry: CustomMetrics, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse(registry)[family].samples}


def test_two_holders_share_one_series() -> None:
    registry = CustomMetrics()
    first, second = object(), object()
    counters = [registry.declare(holder, "requests_total_ns", "Cumulative time", "counter")
                for holder in (first, second)]
    assert counters[0] is counters[1]
    one = registry.acquire(first, counters[0], {"model": "m", "version": "1"})
    two = registry.acquire(second, counters[1], {"version": "1", "model": "m"})
    assert one is two
    registry.update(one, add=2.0)
    registry.update(two, add=3.5)
    assert registry.value(one) == 5.5
    text = "\n".join(registry.render())
    assert text == ('# HELP requests_total_ns Cumulative time\n# TYPE requests_total_ns counter\n'
                    'requests_total_ns{model="m",version="1"} 5.5')
    registry.release(first, one)
    assert registry.value(two) == 5.5 and "requests_total_ns" in parse(registry)
    registry.release(second, two)
    assert list(registry.render()) == []


def test_gauge_keeps_the_latest_set_and_the_increments_after_it() -> None:
    registry = CustomMetrics()
    holder = object()
    gauge = registry.acquire(holder, registry.declare(holder, "queue_depth", "depth", "gauge"), {})
    registry.update(gauge, set_value=4.0, set_ns=200, add=1.0)
    registry.update(gauge, set_value=9.0, set_ns=100)  # set earlier by another process, arrived later
    assert registry.value(gauge) == 5.0
    registry.update(gauge, set_value=2.0, set_ns=300, add=-0.5)
    assert registry.value(gauge) == 1.5
    assert "\n".join(registry.render()).endswith("\nqueue_depth 1.5")  # no braces without labels


def test_histogram_in_prometheus_text_format() -> None:
    registry = CustomMetrics()
    holder = object()
    family = registry.declare(holder, "latency_seconds", "Request latency", "histogram")
    series = registry.acquire(holder, family, {"model": "m"}, [0.1, 0.5, 1.0])
    registry.update(series, bucket_adds=[1, 0, 2, 1], sum_add=3.75)
    registry.update(series, bucket_adds=[0, 1, 0, 0], sum_add=0.25)
    lines = list(registry.render())
    assert lines[2] == 'latency_seconds_bucket{model="m",le="0.1"} 1'
    assert lines[5:] == ['latency_seconds_bucket{model="m",le="+Inf"} 5', 'latency_seconds_sum{model="m"} 4',
                         'latency_seconds_count{model="m"} 5']
    parsed = samples(registry, "latency_seconds")
    assert [parsed[("latency_seconds_bucket", (("le", le), ("model", "m")))] for le in ("0.1", "0.5", "1", "+Inf")
            ] == [1, 2, 4, 5]
    assert parsed[("latency_seconds_sum", (("model", "m"),))] == 4.0
    with pytest.raises(CustomMetricError, match="already exists with buckets"):
        registry.acquire(object(), family, {"model": "m"}, [1.0])
    with pytest.raises(CustomMetricError, match="strictly increasing"):
        registry.acquire(holder, family, {"model": "n"}, [1.0, 1.0])


def test_kind_clashes_reserved_names_and_sample_names_are_refused() -> None:
    registry = CustomMetrics()
    holder = object()
    registry.declare(holder, "shared", "first description", "counter")
    with pytest.raises(CustomMetricError, match="'shared' already exists with kind COUNTER"):
        registry.declare(object(), "shared", "other", "gauge")
    assert registry.declare(object(), "shared", "second description", "counter").description == "first description"
    for name in ("nv_inference_count", "nv_gpu_utilization", "naiad_anything"):
        with pytest.raises(CustomMetricError, match="reserved"):
            registry.declare(holder, name, "mine", "counter")
    for name in ("bad-name", "__x", ""):
        with pytest.raises(CustomMetricError, match="invalid metric family name"):
            registry.declare(holder, name, "mine", "counter")
    registry.declare(holder, "latency", "h", "histogram")
    with pytest.raises(CustomMetricError, match="clashes with the samples of metric family 'latency'"):
        registry.declare(holder, "latency_count", "c", "counter")
    registry.declare(holder, "depth_sum", "c", "counter")
    with pytest.raises(CustomMetricError, match="'depth' clashes with the samples of metric family 'depth_sum'"):
        registry.declare(holder, "depth", "h", "histogram")
    registry.declare(holder, "depth", "a gauge prints no _sum", "gauge")
    family = registry.declare(holder, "with_labels", "x", "histogram")
    with pytest.raises(CustomMetricError, match="'le' is reserved"):
        registry.acquire(holder, family, {"le": "1"}, [1.0])
    with pytest.raises(CustomMetricError, match="invalid label name 'a-b'"):
        registry.acquire(holder, registry.declare(holder, "gauge_x", "x", "gauge"), {"a-b": "1"})


def test_a_gone_holder_lets_go_of_everything_it_held() -> None:
    registry = CustomMetrics()
    dead, alive = object(), object()
    counter = registry.declare(dead, "restarts", "r", "counter")
    kept = registry.acquire(dead, counter, {"a": "1"})
    gone = registry.acquire(dead, counter, {"a": "2"})
    registry.update(kept, add=3)
    assert registry.acquire(alive, registry.declare(alive, "restarts", "r", "counter"), {"a": "1"}) is kept
    registry.release_holder(dead)
    assert registry.value(kept) == 3 and gone not in counter.series.values()
    assert registry.families() == ["restarts"]
    registry.release_holder(alive)
    assert registry.families() == []
    registry.declare(object(), "restarts", "now a gauge", "gauge")  # nobody holds the old one


def test_label_values_and_descriptions_are_escaped() -> None:
    registry = CustomMetrics()
    holder = object()
    family = registry.declare(holder, "escaped", 'a "quoted"\\ description\non two lines', "gauge")
    series = registry.acquire(holder, family, {"path": 'C:\\dir\n"x"'})
    registry.update(series, set_value=math.inf, set_ns=1)
    parsed = parse(registry)["escaped"]
    assert parsed.documentation == 'a "quoted"\\ description\non two lines'
    assert parsed.samples[0].labels == {"path": 'C:\\dir\n"x"'} and parsed.samples[0].value == math.inf


def test_the_metrics_page_carries_custom_families_after_the_servers() -> None:
    registry = CustomMetrics()
    holder = object()
    series = registry.acquire(holder, registry.declare(holder, "my_counter", "mine", "counter"), {"k": "v"})
    registry.update(series, add=1)
    text = Metrics(lambda: [], cpu=False, custom=registry).text().decode()
    assert text == '# HELP my_counter mine\n# TYPE my_counter counter\nmy_counter{k="v"} 1\n'
