"""pb_utils' custom metrics: values kept in the model process, mirrored to the runtime's hook."""

from __future__ import annotations

import gc

import pytest
from backends.python.pb_fakes import MetricRuntime

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# -- custom metrics --------------------------------------------------------------------------


def test_counter_and_gauge() -> None:
    requests = pb_utils.MetricFamily("t_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
    counter = requests.Metric(labels={"model": "m"})
    assert counter.value() == 0.0
    counter.increment(2023.0)
    assert counter.value() == 2023.0
    with pytest.raises(E, match="TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                                "non-negative values"):
        counter.increment(-1)
    with pytest.raises(E, match=r"^Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set$"):
        counter.set(1)
    with pytest.raises(E, match="does not support Observe"):
        counter.observe(0.05)
    family = pb_utils.MetricFamily(name="t_queue", description="queue depth", kind=pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric()
    gauge.increment(5)
    gauge.increment(-1.5)
    assert gauge.value() == 3.5
    gauge.set(999.9)
    assert gauge.value() == 999.9
    with pytest.raises(E):
        gauge.observe(1)


def test_histogram() -> None:
    family = pb_utils.MetricFamily("t_latency", "latency", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(E, match=r"^Failed to create metric\. Missing required buckets\.$"):
        family.Metric(labels={})
    with pytest.raises(E, match=r"^Failed to create metric\. Buckets must be a list\.$"):
        family.Metric(buckets=(1.0, 2.0))
    for bad in ([2.5, 0.1, 1.0], [1, 1, 2]):
        with pytest.raises(E, match="strictly increasing"):
            family.Metric(buckets=bad)
    family.Metric(labels={"empty": "yes"}, buckets=[])
    histogram = family.Metric(labels={"a": "b"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for sample in (0.05, 1.5, 6.0):
        histogram.observe(sample)
    series = histogram._series
    assert (series.count, series.sum, series.bucket_counts) == (3, 7.55, [1, 0, 1, 0, 1, 0])
    for operation in (histogram.value, lambda: histogram.increment(1), lambda: histogram.set(1)):
        with pytest.raises(E, match="TRITONSERVER_METRIC_KIND_HISTOGRAM does not support"):
            operation()
    with pytest.raises(E, match=r"^Failed to create metric\. Unexpected buckets found\.$"):
        pb_utils.MetricFamily("t_gauge_buckets", "g", pb_utils.MetricFamily.GAUGE).Metric(buckets=[1.0])
    with pytest.raises(E, match=r"^Failed to create metric\. Labels must be a dictionary\.$"):
        family.Metric(labels=[("a", "b")], buckets=[1.0])  # type: ignore[arg-type]


def test_metric_families_and_series_are_shared_by_name_and_labels() -> None:
    first = pb_utils.MetricFamily("t_dup", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("t_dup", "second description", pb_utils.MetricFamily.COUNTER)
    assert second._state is first._state and first._state.description == "first description"
    with pytest.raises(E, match=r"^Error when creating MetricFamily: "):
        pb_utils.MetricFamily("t_dup", "other kind", pb_utils.MetricFamily.GAUGE)
    one, two = first.Metric(labels={"k": "v"}), second.Metric(labels={"k": "v"})
    one.increment(7.5)
    assert two.value() == 7.5
    other = first.Metric(labels={"k": "w"})
    assert other.value() == 0.0


def test_metrics_of_a_deleted_family_refuse_to_work() -> None:
    family = pb_utils.MetricFamily("t_lifetime", "lifetime", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"x": "y"})
    del family
    gc.collect()
    message = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
    for operation in (lambda: metric.set(10), lambda: metric.increment(10), metric.value):
        with pytest.raises(E, match=message):
            operation()


def test_metric_changes_reach_the_runtime_hook() -> None:
    hook = MetricRuntime()
    pb_utils._set_runtime(hook)
    family = pb_utils.MetricFamily("t_hooked", "hooked", pb_utils.MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={"m": "x"}, buckets=[1.0])
    metric.observe(0.5)
    metric.observe(3.0)
    del metric
    gc.collect()
    assert [event["op"] for event in hook.events] == ["update", "update", "update", "delete"]
    last_update = hook.events[2]
    assert last_update == {"op": "update", "family": "t_hooked", "description": "hooked", "kind": "histogram",
                           "labels": {"m": "x"}, "value": 0.0, "buckets": [1.0], "bucket_counts": [1, 2],
                           "count": 2, "sum": 3.5}
    assert family._state.series == {}
