"""pb_utils' custom metrics in the model process: upstream's API and errors, the changes recorded for
the server (batched per series, in order), names the server refuses failing at creation."""

from __future__ import annotations

import gc
import re

import pytest
from backends.python.pb_fakes import MetricRuntime

from naiad.backends.python import pb_metrics, pb_utils

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


def test_changes_are_recorded_once_per_series_and_in_order() -> None:
    hook = MetricRuntime()
    pb_utils._set_runtime(hook)
    family = pb_utils.MetricFamily("t_batched", "per request", pb_utils.MetricFamily.COUNTER)
    counter = family.Metric(labels={"m": "x"})
    for _ in range(1000):  # a counter incremented per request: one update, one wake-up
        counter.increment(1)
    series = counter._series.id
    assert hook.wakes == 1
    assert pb_metrics.take_changes() == [
        pb_metrics.FamilyDeclared("t_batched", "per request", "counter"),
        pb_metrics.SeriesAcquired(series, "t_batched", {"m": "x"}, None),
        pb_metrics.SeriesUpdated(series, 1000.0, None, 0, [], 0.0)]
    counter.increment(2.5)
    del counter
    gc.collect()
    assert pb_metrics.take_changes() == [pb_metrics.SeriesUpdated(series, 2.5, None, 0, [], 0.0),
                                         pb_metrics.SeriesReleased(series)]
    assert hook.wakes == 2 and family._state.series == {}


def test_gauge_and_histogram_changes() -> None:
    pb_utils._set_runtime(MetricRuntime())
    gauges = pb_utils.MetricFamily("t_gauge_changes", "g", pb_utils.MetricFamily.GAUGE)
    gauge = gauges.Metric()
    gauge.increment(5)
    gauge.set(2)
    gauge.increment(-0.5)  # after the set: sent as the set value then the increment
    histograms = pb_utils.MetricFamily("t_histogram_changes", "h", pb_utils.MetricFamily.HISTOGRAM)
    histogram = histograms.Metric(labels={"a": "b"}, buckets=[1.0, 2.0, float("inf")])  # +Inf is implicit
    for sample in (0.5, 1.0, 1.5, 9.0):
        histogram.observe(sample)
    changes = pb_metrics.take_changes()
    # the histogram's family came after the gauge's changes: they were sealed before it
    assert [type(change).__name__ for change in changes] == [
        "FamilyDeclared", "SeriesAcquired", "SeriesUpdated", "FamilyDeclared", "SeriesAcquired", "SeriesUpdated"]
    gauge_update, histogram_update = changes[2], changes[5]
    assert (gauge_update.add, gauge_update.set_value, gauge_update.set_ns > 0) == (-0.5, 2.0, True)
    assert gauge.value() == 1.5
    assert histogram._series.buckets == [1.0, 2.0]
    assert (histogram_update.bucket_adds, histogram_update.sum_add) == ([2, 1, 1], 12.0)
    assert pb_metrics.take_changes() == []


def test_value_is_the_servers_when_the_runtime_can_ask() -> None:
    hook = MetricRuntime()
    pb_utils._set_runtime(hook)
    family = pb_utils.MetricFamily("t_shared", "s", pb_utils.MetricFamily.COUNTER)
    counter = family.Metric()
    counter.increment(1)
    assert counter.value() == 1.0  # the runtime cannot ask now: this process's copy
    hook.value = 7.0  # another process incremented the same series
    assert counter.value() == 7.0 and hook.values_asked == [counter._series.id] * 2


def test_names_and_labels_the_server_refuses_fail_at_creation() -> None:
    for name in ("nv_inference_count", "nv_my_metric", "naiad_requests"):
        with pytest.raises(E, match=rf"^Error when creating MetricFamily: metric family name '{name}' is reserved"):
            pb_utils.MetricFamily(name, "mine", pb_utils.MetricFamily.COUNTER)
    for name in ("bad-name", "1abc", "__private", "with space"):
        with pytest.raises(E, match="invalid metric family name"):
            pb_utils.MetricFamily(name, "mine", pb_utils.MetricFamily.GAUGE)
    histogram = pb_utils.MetricFamily("t_labels_refused", "h", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(E, match=r"^Error when creating Metric: the label name 'le' is reserved in a histogram"):
        histogram.Metric(labels={"le": "1"}, buckets=[1.0])
    for label in ("bad-label", "__name__", "0x"):
        with pytest.raises(E, match=rf"^Error when creating Metric: invalid label name '{label}'"):
            histogram.Metric(labels={label: "v"}, buckets=[1.0])
    with pytest.raises(E, match="finite"):
        histogram.Metric(buckets=[float("nan")])
    counter = pb_utils.MetricFamily("t_le_is_fine_here", "c", pb_utils.MetricFamily.COUNTER)
    counter.Metric(labels={"le": "x", "quantile": "0.5"})  # reserved only where Prometheus reserves them


def test_a_family_the_server_refused_fails_at_its_next_use() -> None:
    pb_utils._set_runtime(MetricRuntime())
    family = pb_utils.MetricFamily("t_refused", "r", pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric()
    others = pb_utils.MetricFamily("t_series_refused", "r", pb_utils.MetricFamily.GAUGE)
    other = others.Metric(labels={"a": "b"})
    message = "Error when creating MetricFamily: a metric family named 't_refused' already exists with kind COUNTER"
    pb_metrics.reject("t_refused", 0, message)
    pb_metrics.reject("t_series_refused", other._series.id, "Error when creating Metric: no")
    with pytest.raises(E, match=r"^Failed to set metric value: Error when creating MetricFamily: a metric family "):
        gauge.set(1)
    with pytest.raises(E, match=re.escape(message)):
        pb_utils.MetricFamily("t_refused", "again", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(E, match=r"^Failed to increment metric value: Error when creating Metric: no$"):
        other.increment(1)
