"""pb_utils' custom metrics: MetricFamily and Metric, values kept in the model process and mirrored
to the runtime's optional `metric` hook (see pb_utils)."""

from __future__ import annotations

import contextlib
import enum
import itertools
import json
import sys
import threading
import weakref

from naiad.backends.python import pb_runtime
from naiad.backends.python.pb_errors import TritonModelException

# -- custom metrics --------------------------------------------------------------------------


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_TEXT = {MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
              MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
              MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


class _FamilyState:
    """One metric family of the process, shared by every MetricFamily object of that name (the
    server's registry does the same: a second family of the same name is the first one)."""

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[str, _SeriesState] = {}  # by labels JSON


class _SeriesState:
    """One labelled series: the value (counter, gauge) or the histogram's buckets, count and sum.
    Every Metric object with the same labels shares it, as the server's metrics do."""

    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = labels
        self.value = 0.0
        self.buckets = buckets
        self.bucket_counts = [0] * (len(buckets) + 1) if buckets is not None else []  # the last one is +Inf
        self.count = 0
        self.sum = 0.0
        self.references = 0


_metrics_lock = threading.RLock()
_families: dict[str, _FamilyState] = {}


class MetricFamily:
    """A custom metric family: `MetricFamily(name, description, MetricFamily.COUNTER)`; then
    `.Metric(labels={...})` (histograms: `buckets=[...]`) for each labelled series.

    Values are kept in this process (`value()` answers from here). When the runtime defines
    `metric(event)`, every change is also passed on as a dict: {"op": "update" | "delete",
    "family", "description", "kind" ("counter" | "gauge" | "histogram"), "labels", "value",
    "buckets", "bucket_counts" (cumulative, one per bucket then +Inf), "count", "sum"}.
    A MetricFamily must outlive its Metric objects: deleting it first disables them, as upstream.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        try:
            metric_kind = MetricKind(kind)
        except (ValueError, TypeError):
            raise TypeError(f"MetricFamily(): kind must be a MetricFamily kind, got {kind!r}") from None
        if not name:
            raise TritonModelException("Error when creating MetricFamily: metric family name must not be empty")
        with _metrics_lock:
            state = _families.get(name)
            if state is None:
                state = _families[name] = _FamilyState(name, description, metric_kind)
            elif state.kind != metric_kind:
                raise TritonModelException(
                    f"Error when creating MetricFamily: a metric family named '{name}' already exists with kind "
                    f"{state.kind.name}")
        self._state = state
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()

    # Upstream's name for the method, capitalised as it is.
    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        kind = self._state.kind
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [float(bound) for bound in buckets]
            if any(upper <= lower for lower, upper in itertools.pairwise(bounds)):
                raise TritonModelException(
                    "Error when creating Metric: histogram bucket boundaries must be in strictly increasing order")
        elif kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        else:
            bounds = None
        label_map = dict(labels or {})
        for key, value in label_map.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("Error when creating Metric: label keys and values must be strings")
        metric = Metric._attach(self._state, label_map, bounds)
        self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        # Upstream clears the metrics made through this object when it goes away. Errors are
        # dropped: __del__ may run at interpreter shutdown, with nobody to report them to.
        with contextlib.suppress(Exception):
            for metric in list(self._metrics):
                metric._clear()


class Metric:
    """One labelled series of a MetricFamily: `increment(v)`, `set(v)` (gauges), `observe(v)`
    (histograms), `value()` (counters and gauges)."""

    def __init__(self) -> None:
        raise TypeError("Metric objects are made by MetricFamily.Metric(labels=..., buckets=...)")

    @classmethod
    def _attach(cls, family: _FamilyState, labels: dict[str, str], buckets: list[float] | None) -> Metric:
        key = json.dumps(labels, sort_keys=True)
        with _metrics_lock:
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _SeriesState(labels, buckets)
                created = True
            else:
                created = False
            series.references += 1
        metric = cls.__new__(cls)
        metric._family = family
        metric._key = key
        metric._series = series
        metric._cleared = False
        if created:
            _publish("update", family, series, "Error when creating Metric: ")
        return metric

    def _check(self, what: str) -> None:
        if self._cleared:
            raise TritonModelException(
                f"{what}Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted.")

    def increment(self, value: float) -> None:
        what = "Failed to increment metric value: "
        self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Increment")
        if kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                f"{what}TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                "values.")
        with _metrics_lock:
            self._series.value += float(value)
        _publish("update", self._family, self._series, what)

    def set(self, value: float) -> None:
        what = "Failed to set metric value: "
        self._check(what)
        kind = self._family.kind
        if kind != MetricKind.GAUGE:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Set")
        with _metrics_lock:
            self._series.value = float(value)
        _publish("update", self._family, self._series, what)

    def observe(self, value: float) -> None:
        what = "Failed to observe metric value: "
        self._check(what)
        kind = self._family.kind
        if kind != MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Observe")
        sample = float(value)
        series = self._series
        with _metrics_lock:
            assert series.buckets is not None
            index = next((i for i, bound in enumerate(series.buckets) if sample <= bound), len(series.buckets))
            series.bucket_counts[index] += 1
            series.count += 1
            series.sum += sample
        _publish("update", self._family, series, what)

    def value(self) -> float:
        what = "Failed to get metric value: "
        self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Value")
        with _metrics_lock:
            return self._series.value

    def _clear(self) -> None:
        """Drop this object's hold on its series (the last one removes the series)."""
        with _metrics_lock:
            if self._cleared:
                return
            self._cleared = True
            self._series.references -= 1
            gone = self._series.references == 0
            if gone:
                self._family.series.pop(self._key, None)
        if gone:
            try:
                _publish("delete", self._family, self._series, "Error when deleting Metric: ")
            except TritonModelException as error:
                print(error, file=sys.stderr)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # see MetricFamily.__del__
            self._clear()


def _publish(op: str, family: _FamilyState, series: _SeriesState, what: str) -> None:
    hook = getattr(pb_runtime.get(), "metric", None)
    if hook is None:
        return
    with _metrics_lock:
        cumulative, running = [], 0
        for count in series.bucket_counts:
            running += count
            cumulative.append(running)
        event = {
            "op": op, "family": family.name, "description": family.description, "kind": family.kind.name.lower(),
            "labels": dict(series.labels), "value": series.value,
            "buckets": list(series.buckets) if series.buckets is not None else None,
            "bucket_counts": cumulative, "count": series.count, "sum": series.sum,
        }
    try:
        hook(event)
    except Exception as error:
        raise TritonModelException(f"{what}{error}") from error
