"""Custom metric families that models create (Triton's TRITONSERVER_Metric* API), server-wide.

Python models create families with `pb_utils.MetricFamily` and labelled series with
`MetricFamily.Metric`; their changes reach this registry, and /metrics prints every family as
the model declared it: the model's name, description and labels only (no model or version
label is added), as Triton does.

The registry is shared by every model process of the server, as Triton's is: two processes (two
instances, or two models) that create the same family and a series with the same labels share
ONE series. Counter increments and histogram observations add up; a gauge shows the last value
set (by the setter's clock) plus the increments after it.

A series lives while some holder (a model process) holds it. A process that deletes its last
Metric object of a series, or goes away, lets go of it; the series leaves the page when nobody
holds it any more (Triton removes a series with its last Metric). So a reload that creates the
same series before the old version unloads keeps its values, and so does a restarted model
process of an instance (see the Python backend's custom_metrics module).

Names the server renders itself (`nv_*`, and `naiad_*` kept for later) cannot be taken, and
names and labels that would break the Prometheus text format are refused at creation, so a
model's mistake is an error in that model and never a broken scrape for everyone else.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field

KINDS = ("counter", "gauge", "histogram")
#: families the server prints itself: Triton's `nv_*` and naiad's own
RESERVED_PREFIXES = ("nv_", "naiad_")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class CustomMetricError(ValueError):
    """A family, series or label the registry refuses; the message says why, for the model."""


# -- naming rules (also checked in the model process, so the model fails at creation) ----------


def check_family_name(name: str) -> None:
    if not _METRIC_NAME.fullmatch(name) or name.startswith("__"):
        raise CustomMetricError(
            f"invalid metric family name '{name}': a Prometheus metric name matches [a-zA-Z_:][a-zA-Z0-9_:]* "
            "and does not start with '__'")
    if name.startswith(RESERVED_PREFIXES):
        prefixes = " or ".join(f"'{prefix}'" for prefix in RESERVED_PREFIXES)
        raise CustomMetricError(
            f"metric family name '{name}' is reserved: names starting with {prefixes} are the server's own metrics")


def check_labels(labels: dict[str, str], kind: str) -> None:
    for label in labels:
        if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
            raise CustomMetricError(
                f"invalid label name '{label}': a Prometheus label name matches [a-zA-Z_][a-zA-Z0-9_]* and does not "
                "start with '__'")
        if label == "le" and kind == "histogram":
            raise CustomMetricError("the label name 'le' is reserved in a histogram (it holds the bucket bounds)")


def check_buckets(buckets: list[float]) -> list[float]:
    """Histogram bucket upper bounds, strictly increasing; a last +Inf bound is implicit and dropped."""
    bounds = [float(bound) for bound in buckets]
    if bounds and bounds[-1] == math.inf:
        bounds.pop()
    if any(math.isnan(bound) or math.isinf(bound) for bound in bounds):
        raise CustomMetricError(f"histogram bucket bounds must be finite numbers, got {buckets}")
    if any(upper <= lower for lower, upper in itertools.pairwise(bounds)):
        raise CustomMetricError("histogram bucket boundaries must be in strictly increasing order")
    return bounds


# -- the registry ------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Series:
    """One labelled series of a family (see `CustomMetrics`)."""

    family: Family
    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = ()  # histogram upper bounds, +Inf implicit
    value: float = 0.0  # counter and gauge value
    set_ns: int = -1  # the setter's monotonic clock of the gauge value last set
    bucket_counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), then +Inf
    count: int = 0
    sum: float = 0.0
    holders: dict[Hashable, int] = field(default_factory=dict)  # holder -> references


@dataclass(eq=False, slots=True)
class Family:
    name: str
    description: str
    kind: str
    series: dict[tuple[tuple[str, str], ...], Series] = field(default_factory=dict)
    declared_by: set[Hashable] = field(default_factory=set)


class CustomMetrics:
    """The server's registry of custom metric families (thread-safe; holders are any hashable
    token, one per model process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}

    def declare(self, holder: Hashable, name: str, description: str, kind: str) -> Family:
        """The family `name`, created if new. A family of that name and another kind, or a name
        that is reserved or would print over another family's samples, raises CustomMetricError.
        The first description stays, as in Triton."""
        if kind not in KINDS:
            raise CustomMetricError(f"unknown metric kind '{kind}'")
        check_family_name(name)
        with self._lock:
            family = self._families.get(name)
            if family is None:
                self._check_sample_names(name, kind)
                family = self._families[name] = Family(name, description, kind)
            elif family.kind != kind:
                raise CustomMetricError(
                    f"a metric family named '{name}' already exists with kind {family.kind.upper()}")
            family.declared_by.add(holder)
            return family

    def _check_sample_names(self, name: str, kind: str) -> None:
        """A histogram prints `<name>_bucket`, `_sum` and `_count`: no other family may be called so."""
        for other in self._families.values():
            taken = {other.name + suffix for suffix in _HISTOGRAM_SUFFIXES} if other.kind == "histogram" else set()
            mine = {name + suffix for suffix in _HISTOGRAM_SUFFIXES} if kind == "histogram" else set()
            if name in taken or other.name in mine:
                raise CustomMetricError(
                    f"metric family name '{name}' clashes with the samples of metric family '{other.name}'")

    def acquire(self, holder: Hashable, family: Family, labels: dict[str, str],
                buckets: Iterable[float] | None = None) -> Series:
        """`holder` takes a reference to the series of `family` with `labels` (created if new)."""
        check_labels(labels, family.kind)
        if family.kind == "histogram":
            bounds = tuple(check_buckets(list(buckets or [])))
        elif buckets is not None:
            raise CustomMetricError(f"a {family.kind} has no buckets")
        else:
            bounds = ()
        key = tuple(sorted(labels.items()))
        with self._lock:
            if self._families.get(family.name) is not family:
                raise CustomMetricError(f"metric family '{family.name}' was removed")
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = Series(family, key, bounds, bucket_counts=[0] * (len(bounds) + 1))
            elif series.buckets != bounds:
                raise CustomMetricError(
                    f"a series of '{family.name}' with labels {labels} already exists with buckets "
                    f"{list(series.buckets)}")
            series.holders[holder] = series.holders.get(holder, 0) + 1
            return series

    def release(self, holder: Hashable, series: Series) -> None:
        """`holder` lets go of one reference to `series`; the series goes with its last holder."""
        with self._lock:
            left = series.holders.get(holder, 0) - 1
            if left > 0:
                series.holders[holder] = left
                return
            series.holders.pop(holder, None)
            self._drop_if_unheld(series)

    def release_holder(self, holder: Hashable) -> None:
        """Everything `holder` holds and declared (its model process is gone)."""
        with self._lock:
            for family in list(self._families.values()):
                family.declared_by.discard(holder)
                for series in list(family.series.values()):
                    if series.holders.pop(holder, None) is not None:
                        self._drop_if_unheld(series)
                self._drop_family_if_unused(family)

    def _drop_if_unheld(self, series: Series) -> None:
        if series.holders:
            return
        family = series.family
        if family.series.get(series.labels) is series:
            del family.series[series.labels]
        self._drop_family_if_unused(family)

    def _drop_family_if_unused(self, family: Family) -> None:
        if not family.series and not family.declared_by and self._families.get(family.name) is family:
            del self._families[family.name]

    def update(self, series: Series, add: float = 0.0, set_value: float | None = None, set_ns: int = 0,
               bucket_adds: Iterable[int] = (), sum_add: float = 0.0) -> None:
        """Apply a holder's changes since its last update: a gauge value set at `set_ns` (ignored
        when another holder set it later), then `add`; histogram observations as counts per
        bucket (+Inf last) and their sum."""
        with self._lock:
            if set_value is not None and set_ns >= series.set_ns:
                series.value, series.set_ns = set_value, set_ns
            series.value += add
            added = 0
            for index, count in enumerate(bucket_adds):
                if index < len(series.bucket_counts):
                    series.bucket_counts[index] += count
                    added += count
            series.count += added
            series.sum += sum_add

    def value(self, series: Series) -> float:
        with self._lock:
            return series.value

    def families(self) -> list[str]:
        with self._lock:
            return list(self._families)

    def render(self) -> Iterator[str]:
        """The families that have series, in Prometheus text format (labels sorted by name)."""
        with self._lock:
            families = [(f.name, f.description, f.kind, list(f.series.values())) for f in self._families.values()]
            lines: list[str] = []
            for name, description, kind, series_list in families:
                if not series_list:
                    continue
                lines.append(f"# HELP {name} {_escape_help(description)}")
                lines.append(f"# TYPE {name} {kind}")
                for series in series_list:
                    lines.extend(_samples(name, kind, series))
        return iter(lines)


def _samples(name: str, kind: str, series: Series) -> Iterator[str]:
    labels = series.labels
    if kind != "histogram":
        yield f"{name}{_labels(labels)} {_number(series.value)}"
        return
    running = 0
    for bound, count in zip((*series.buckets, math.inf), series.bucket_counts, strict=True):
        running += count
        yield f"{name}_bucket{_labels(labels, le=_number(bound))} {running}"
    yield f"{name}_sum{_labels(labels)} {_number(series.sum)}"
    yield f"{name}_count{_labels(labels)} {series.count}"


def _labels(labels: Iterable[tuple[str, str]], le: str | None = None) -> str:
    """`{a="x",b="y"}` sorted by name, a bucket's `le` last (as Triton's prometheus-cpp prints it);
    nothing for no labels."""
    pairs = sorted(labels)
    if le is not None:
        pairs.append(("le", le))
    if not pairs:
        return ""
    return "{" + ",".join(f'{key}="{_escape_value(value)}"' for key, value in pairs) + "}"


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    """As Prometheus clients print numbers: integral values without a fraction, +Inf, NaN."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(value)
