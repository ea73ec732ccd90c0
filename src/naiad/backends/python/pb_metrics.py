"""pb_utils' custom metrics: MetricFamily and Metric (counter, gauge, histogram), as upstream.

The values live on the server, in one registry for every model process (Triton's is
server-wide too): /metrics prints each family as the model declared it. This process keeps its
own copy and records every change for the server; the runtime collects them with
`take_changes()` and sends them ahead of its next message to the server (an execute's changes
ride with its responses), or after a short delay when nothing else goes out. So a model that
increments a counter per request adds no message, and a client that gets its response and then
scrapes /metrics sees the increment.

`value()` answers with the server's value of the series (the sum over every process sharing
it) when the runtime can ask (`metric_value`), else with this process's copy.

Names and labels the server refuses (reserved `nv_*` / `naiad_*` families, invalid Prometheus
names, `le` on a histogram) fail here at creation with a TritonModelException. What only the
server can see (a family of the same name and another kind created by another model process)
comes back as a rejection (`reject()`): the next use of that family or series raises its message.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import itertools
import sys
import threading
import time
import weakref
from typing import NamedTuple

from naiad.backends.python import pb_runtime
from naiad.backends.python.pb_args import as_float, as_str
from naiad.backends.python.pb_errors import TritonModelException
from naiad.observability.custom_metrics import CustomMetricError, check_buckets, check_family_name, check_labels

# -- what the server is told -------------------------------------------------------------------


class FamilyDeclared(NamedTuple):
    name: str
    description: str
    kind: str  # "counter", "gauge" or "histogram"


class SeriesAcquired(NamedTuple):
    series: int  # this process's id of the series
    family: str
    labels: dict[str, str]
    buckets: list[float] | None


class SeriesUpdated(NamedTuple):
    """What changed since the last update: a gauge value set (at `set_ns`, this host's monotonic
    clock) then `add`; histogram observations as counts per bucket (+Inf last) and their sum."""

    series: int
    add: float
    set_value: float | None
    set_ns: int
    bucket_adds: list[int]
    sum_add: float


class SeriesReleased(NamedTuple):
    series: int


Change = FamilyDeclared | SeriesAcquired | SeriesUpdated | SeriesReleased


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

    __slots__ = ("description", "error", "kind", "name", "series")

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], _SeriesState] = {}
        self.error: str | None = None  # the server refused the family


class _SeriesState:
    """One labelled series: this process's copy of its value (counter, gauge) or buckets, and the
    changes not yet sent. Every Metric object with the same labels shares it."""

    __slots__ = ("add", "bucket_adds", "bucket_counts", "buckets", "count", "dirty", "error", "family", "id", "key",
                 "labels", "references", "set_ns", "set_value", "sum", "sum_add", "value")

    def __init__(self, family: _FamilyState, key: tuple[tuple[str, str], ...], buckets: list[float] | None) -> None:
        self.id = next(_series_ids)
        self.family = family
        self.key = key
        self.labels = dict(key)
        self.buckets = buckets
        self.value = 0.0
        self.bucket_counts = [0] * (len(buckets) + 1) if buckets is not None else []  # the last one is +Inf
        self.count = 0
        self.sum = 0.0
        self.references = 0
        self.error: str | None = None  # the server refused the series
        # changes since the last SeriesUpdated
        self.dirty = False
        self.add = 0.0
        self.set_value: float | None = None
        self.set_ns = 0
        self.bucket_adds = [0] * len(self.bucket_counts)
        self.sum_add = 0.0

    def take_update(self) -> SeriesUpdated:
        update = SeriesUpdated(self.id, self.add, self.set_value, self.set_ns, self.bucket_adds, self.sum_add)
        self.dirty = False
        self.add, self.set_value, self.sum_add = 0.0, None, 0.0
        self.bucket_adds = [0] * len(self.bucket_counts)
        return update


# RLock: a Metric's __del__ may run (garbage collection) while this thread holds the lock.
_lock = threading.RLock()
_families: dict[str, _FamilyState] = {}
_series_ids = itertools.count(1)
_series_by_id: dict[int, _SeriesState] = {}
_changes: list[Change] = []  # in order; value changes are folded in per series until sealed
_dirty: list[_SeriesState] = []


def take_changes() -> list[Change]:
    """Every change since the last call, in order (the runtime sends them to the server)."""
    with _lock:
        _seal()
        changes = _changes[:]
        _changes.clear()
        return changes


def has_changes() -> bool:
    return bool(_changes or _dirty)


def reject(family: str, series: int, error: str) -> None:
    """The server refused `family` (series 0) or one of its series: later uses raise `error`."""
    with _lock:
        state = _series_by_id.get(series) if series else None
        if state is not None:
            state.error = error
        elif not series and family in _families:
            _families[family].error = error


def _record(change: Change) -> bool:
    """Queue a structural change after the value changes before it; True when nothing waited
    before (the runtime is told then). Without a runtime nobody would collect: nothing is kept."""
    if pb_runtime.get() is None:
        return False
    idle = not _changes and not _dirty
    _seal()
    _changes.append(change)
    return idle


def _seal() -> None:
    for series in _dirty:
        _changes.append(series.take_update())
    _dirty.clear()


def _mark_dirty(series: _SeriesState) -> bool:
    """The series has value changes to send; True when nothing waited before."""
    if series.dirty:
        return False
    if pb_runtime.get() is None:
        return False
    idle = not _changes and not _dirty
    series.dirty = True
    _dirty.append(series)
    return idle


def _tell_runtime() -> None:
    hook = getattr(pb_runtime.get(), "metrics_changed", None)
    if hook is not None:
        hook()


class MetricFamily:
    """A custom metric family: `MetricFamily(name, description, MetricFamily.COUNTER)`; then
    `.Metric(labels={...})` (histograms: `buckets=[...]`) for each labelled series.

    A second family of the same name (and kind) is the first one, whose description stays. A
    MetricFamily must outlive its Metric objects: deleting it first disables them, as upstream.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        name = as_str(name, "MetricFamily(): name")
        description = as_str(description, "MetricFamily(): description")
        try:
            metric_kind = MetricKind(kind)
        except (ValueError, TypeError):
            raise TypeError(f"MetricFamily(): kind must be a MetricFamily kind, got {kind!r}") from None
        if not name:
            raise TritonModelException("Error when creating MetricFamily: metric family name must not be empty")
        try:
            check_family_name(name)
        except CustomMetricError as error:
            raise TritonModelException(f"Error when creating MetricFamily: {error}") from None
        tell = False
        with _lock:
            state = _families.get(name)
            if state is None:
                state = _families[name] = _FamilyState(name, description, metric_kind)
                tell = _record(FamilyDeclared(name, description, metric_kind.name.lower()))
            elif state.kind != metric_kind:
                raise TritonModelException(
                    f"Error when creating MetricFamily: a metric family named '{name}' already exists with kind "
                    f"{state.kind.name}")
        if tell:
            _tell_runtime()
        if state.error is not None:
            raise TritonModelException(state.error)
        self._state = state
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()

    # Upstream's name for the method, capitalised as it is.
    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        family = self._state
        kind = family.kind
        bounds: list[float] | None = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [as_float(bound, "Metric(): buckets items") for bound in buckets]
        elif kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        label_map: dict[str, str] = {}
        for key, value in (labels or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("Error when creating Metric: label keys and values must be strings")
            label_map[str(key)] = str(value)
        try:
            check_labels(label_map, kind.name.lower())
            if bounds is not None:
                bounds = check_buckets(bounds)
        except CustomMetricError as error:
            raise TritonModelException(f"Error when creating Metric: {error}") from None
        if family.error is not None:
            raise TritonModelException(family.error)
        metric = Metric._attach(family, label_map, bounds)
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

    _family: _FamilyState
    _series: _SeriesState
    _cleared: bool

    def __init__(self) -> None:
        raise TypeError("Metric objects are made by MetricFamily.Metric(labels=..., buckets=...)")

    @classmethod
    def _attach(cls, family: _FamilyState, labels: dict[str, str], buckets: list[float] | None) -> Metric:
        key = tuple(sorted(labels.items()))
        tell = False
        with _lock:
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _SeriesState(family, key, buckets)
                _series_by_id[series.id] = series
                tell = _record(SeriesAcquired(series.id, family.name, dict(labels), buckets))
            elif series.buckets != buckets:
                raise TritonModelException(
                    f"Error when creating Metric: a series of '{family.name}' with labels {labels} already exists "
                    f"with buckets {series.buckets}")
            series.references += 1
        if tell:
            _tell_runtime()
        metric = cls.__new__(cls)
        metric._family = family
        metric._series = series
        metric._cleared = False
        return metric

    def _check(self, what: str) -> _SeriesState:
        if self._cleared:
            raise TritonModelException(
                f"{what}Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted.")
        series = self._series
        error = series.error or self._family.error
        if error is not None:
            raise TritonModelException(f"{what}{error}")
        return series

    def increment(self, value: float) -> None:
        what = "Failed to increment metric value: "
        amount = as_float(value, "increment(): value")
        series = self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Increment")
        if kind == MetricKind.COUNTER and amount < 0:
            raise TritonModelException(
                f"{what}TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                "values.")
        with _lock:
            series.value += amount
            series.add += amount
            tell = _mark_dirty(series)
        if tell:
            _tell_runtime()

    def set(self, value: float) -> None:
        what = "Failed to set metric value: "
        number = as_float(value, "set(): value")
        series = self._check(what)
        kind = self._family.kind
        if kind != MetricKind.GAUGE:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Set")
        with _lock:
            series.value = number
            series.set_value, series.set_ns, series.add = number, time.monotonic_ns(), 0.0
            tell = _mark_dirty(series)
        if tell:
            _tell_runtime()

    def observe(self, value: float) -> None:
        what = "Failed to observe metric value: "
        sample = as_float(value, "observe(): value")
        series = self._check(what)
        kind = self._family.kind
        if kind != MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Observe")
        assert series.buckets is not None
        index = bisect.bisect_left(series.buckets, sample)  # the first bucket whose bound is >= sample
        with _lock:
            series.bucket_counts[index] += 1
            series.count += 1
            series.sum += sample
            series.bucket_adds[index] += 1
            series.sum_add += sample
            tell = _mark_dirty(series)
        if tell:
            _tell_runtime()

    def value(self) -> float:
        """The series' value on the server (every process sharing it counts), or this process's
        copy where the runtime cannot ask the server (e.g. during initialize)."""
        what = "Failed to get metric value: "
        series = self._check(what)
        kind = self._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException(f"{what}{_KIND_TEXT[kind]} does not support Value")
        ask = getattr(pb_runtime.get(), "metric_value", None)
        if ask is not None:
            try:
                answer = ask(series.id)
            except TritonModelException as error:
                raise TritonModelException(f"{what}{error}") from None
            if answer is not None:
                return float(answer)
        with _lock:
            return series.value

    def _clear(self) -> None:
        """Drop this object's hold on its series (the last one removes the series)."""
        with _lock:
            if self._cleared:
                return
            self._cleared = True
            series = self._series
            series.references -= 1
            if series.references:
                return
            if self._family.series.get(series.key) is series:
                del self._family.series[series.key]
            _series_by_id.pop(series.id, None)
            tell = _record(SeriesReleased(series.id))
        if tell:
            try:
                _tell_runtime()
            except Exception as error:  # __del__ has nobody to raise to
                print(f"Error when deleting Metric: {error}", file=sys.stderr)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # see MetricFamily.__del__
            self._clear()
