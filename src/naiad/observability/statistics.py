"""Per model-version statistics in the shape of Triton's statistics extension (SPEC §6)."""

from __future__ import annotations

import bisect
import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


#: Triton's failure reasons (the `reason` label of nv_inference_request_failure): REJECTED for
#: a full queue or a queue timeout, CANCELED for a request its client gave up, BACKEND for an
#: error from the model's execution, OTHER for the rest (validation...).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_INFER_FIELDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                 "cache_hit", "cache_miss")
_BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")


#: Triton's default summary quantiles, as (quantile, allowed error) pairs.
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
#: Triton's default first-response histogram buckets, in ms.
DEFAULT_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
#: The latency families a summary observes, by the statistics field they follow.
SUMMARY_FIELDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
#: A model with the response cache drops the request summary (Triton does, as its figures would
#: mislead) and observes its cache lookups instead.
CACHE_SUMMARY_FIELDS = ("queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
#: How long, and how many, observations a summary keeps for its quantiles (Triton's summaries
#: also slide over the last 60 s); the count and sum cover all time.
SUMMARY_MAX_AGE_NS = 60 * 10**9
SUMMARY_MAX_OBSERVATIONS = 10_000
#: How many of its latest requests a version keeps while the web console watches it (for the
#: console's p50/p99): the newest this many, so a busy model's window is a recent sample.
RECENT_MAX_REQUESTS = 4096
#: A recent request: (monotonic ns at its end, total ns, queue ns, compute ns)
RecentRequest = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class LatencySettings:
    """What --metrics-config turns on: the µs counters (on by default), the per-phase summaries
    and the first-response histogram (both off by default, as in Triton)."""

    counters: bool = True
    summaries: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    histogram: bool = False
    buckets_ms: tuple[float, ...] = DEFAULT_BUCKETS_MS

    @classmethod
    def from_config(cls, settings: dict[str, str]) -> LatencySettings:
        """`--metrics-config` key=value pairs: counter_latencies, summary_latencies,
        histogram_latencies (true/false) and summary_quantiles ("0.5:0.05,0.9:0.01")."""
        known = {"counter_latencies", "summary_latencies", "histogram_latencies", "summary_quantiles"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown --metrics-config setting '{unknown[0]}'")

        def flag(key: str, default: bool) -> bool:
            value = settings.get(key)
            if value is None:
                return default
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--metrics-config {key} must be true or false, got {value!r}")
            return value.lower() in ("true", "1")

        quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
        if "summary_quantiles" in settings:
            try:
                quantiles = tuple((float(q), float(e)) for q, e in
                                  (pair.split(":") for pair in settings["summary_quantiles"].strip('"').split(",")))
            except ValueError:
                raise ValueError("--metrics-config summary_quantiles must look like 0.5:0.05,0.9:0.01") from None
            if not all(0 <= q <= 1 for q, _ in quantiles):
                raise ValueError("--metrics-config summary_quantiles must be between 0 and 1")
        return cls(flag("counter_latencies", True), flag("summary_latencies", False), quantiles,
                   flag("histogram_latencies", False))


class Summary:
    """Observations in µs of the last minute (at most SUMMARY_MAX_OBSERVATIONS), plus all-time
    count and sum; quantiles are computed exactly from the window when scraped."""

    __slots__ = ("count", "sum", "window")

    def __init__(self) -> None:
        self.window: deque[tuple[int, float]] = deque(maxlen=SUMMARY_MAX_OBSERVATIONS)
        self.count = 0
        self.sum = 0.0

    def observe(self, now_ns: int, value_us: float) -> None:
        self.window.append((now_ns, value_us))
        self.count += 1
        self.sum += value_us

    def quantiles(self, now_ns: int, wanted: tuple[tuple[float, float], ...]) -> list[tuple[float, float]]:
        while self.window and self.window[0][0] < now_ns - SUMMARY_MAX_AGE_NS:
            self.window.popleft()
        values = sorted(value for _, value in self.window)
        if not values:
            return [(q, float("nan")) for q, _ in wanted]
        return [(q, values[min(len(values) - 1, int(q * len(values)))]) for q, _ in wanted]


class Histogram:
    """Cumulative bucket counts (the last bucket is +Inf), sum and count, in ms."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value_ms: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value_ms)] += 1
        self.count += 1
        self.sum += value_ms

    def cumulative(self) -> list[tuple[str, int]]:
        total, rows = 0, []
        for bound, count in zip([*map(_bound, self.bounds), "+Inf"], self.counts, strict=True):
            total += count
            rows.append((bound, total))
        return rows


def _bound(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters the metrics page prints, read at once under the lock."""

    success: int
    failures: dict[str, int]
    inference_count: int
    execution_count: int
    durations_ns: dict[str, int]
    cache_hits: int = 0
    cache_misses: int = 0


_log = logging.getLogger(__name__)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_PAGE_LABELS = frozenset({"model", "version", "reason", "le", "quantile"})


@dataclass(slots=True)
class ModelStatistics:
    """Counters for one loaded model version; updated from runner threads."""

    name: str
    version: str
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    infer: dict[str, Duration] = field(default_factory=lambda: {k: Duration() for k in _INFER_FIELDS})
    batches: dict[int, dict[str, Duration]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    latency: LatencySettings = field(default_factory=LatencySettings)  # the server's, from --metrics-config
    summaries: dict[str, Summary] = field(default_factory=dict)  # by SUMMARY_FIELDS, when on
    first_response: Histogram | None = None  # when on
    load_duration_s: float | None = None  # set once the version has loaded
    tags: dict[str, str] = field(default_factory=dict)  # config metric_tags: extra metric labels
    cache_enabled: bool = False  # the response cache serves this version (its metrics are printed)
    #: The latest requests while the web console watches (`watch_recent`), else None: an
    #: unwatched version pays one attribute test per request and nothing more.
    recent: deque[RecentRequest] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # Tags that would break the metrics page (an invalid label name, or one the page sets
        # itself) are refused when the config loads (config/validate.py); any that got here
        # anyway are left off, so that one model cannot break /metrics for the others.
        unusable = [key for key in self.tags if not _LABEL_NAME.match(key) or key.startswith("__")
                    or key in _PAGE_LABELS]
        if unusable:
            _log.warning("model '%s': metric_tags %s left off the metrics page", self.name, unusable)
            self.tags = {key: value for key, value in self.tags.items() if key not in unusable}
        if self.latency.summaries:
            fields = CACHE_SUMMARY_FIELDS if self.cache_enabled else SUMMARY_FIELDS
            self.summaries = {key: Summary() for key in fields}
        if self.latency.histogram:
            self.first_response = Histogram(self.latency.buckets_ms)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of `batch_size` inferences, with its compute phases in ns."""
        now_ms = time.time_ns() // 1_000_000
        with self.lock:
            self.execution_count += 1
            self.inference_count += batch_size
            self.last_inference_ms = now_ms
            by_size = self.batches.get(batch_size)
            if by_size is None:
                by_size = self.batches[batch_size] = {k: Duration() for k in _BATCH_FIELDS}
            # Unrolled (no loop, no method calls): this runs for every batch.
            phase = by_size["compute_input"]
            phase.count += 1
            phase.ns += input_ns
            phase = by_size["compute_infer"]
            phase.count += 1
            phase.ns += infer_ns
            phase = by_size["compute_output"]
            phase.count += 1
            phase.ns += output_ns

    def record_request(self, ok: bool, total_ns: int, queue_ns: int, compute: tuple[int, int, int],
                       reason: str = "BACKEND") -> None:
        """One request's outcome; compute holds its share of (input, infer, output) ns; a failed
        one counts under `reason`."""
        infer = self.infer
        with self.lock:
            if not ok:
                infer["fail"].add(total_ns)
                self.failures[reason] += 1
                return
            # Unrolled (no loop, no method calls): this runs for every request.
            phase = infer["success"]
            phase.count += 1
            phase.ns += total_ns
            phase = infer["queue"]
            phase.count += 1
            phase.ns += queue_ns
            phase = infer["compute_input"]
            phase.count += 1
            phase.ns += compute[0]
            phase = infer["compute_infer"]
            phase.count += 1
            phase.ns += compute[1]
            phase = infer["compute_output"]
            phase.count += 1
            phase.ns += compute[2]
            if self.recent is not None:
                self.recent.append((time.monotonic_ns(), total_ns, queue_ns, compute[0] + compute[1] + compute[2]))
            if self.summaries:
                now = time.monotonic_ns()
                for key, ns in zip(SUMMARY_FIELDS, (total_ns, queue_ns, *compute), strict=True):
                    summary = self.summaries.get(key)  # no request summary with the cache on
                    if summary is not None:
                        summary.observe(now, ns / 1000)

    def record_cache_hit(self, total_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache: it counts as a success (its time in
        success and queue) and a cache hit, never as an inference or an execution."""
        with self.lock:
            self.infer["success"].add(total_ns)
            self.infer["queue"].add(queue_ns)
            self.infer["cache_hit"].add(lookup_ns)
            if self.recent is not None:
                self.recent.append((time.monotonic_ns(), total_ns, queue_ns, 0))
            if self.summaries:
                now = time.monotonic_ns()
                self.summaries["queue"].observe(now, queue_ns / 1000)
                self.summaries["cache_hit"].observe(now, lookup_ns / 1000)

    def record_cache_miss(self, lookup_ns: int, insert_ns: int) -> None:
        """A successful request the cache missed: the lookup and the insertion of its response.
        The insertion ran after record_request, so it is added to the request's duration too
        (Triton's request duration includes the cache miss time)."""
        with self.lock:
            self.infer["cache_miss"].add(lookup_ns + insert_ns)
            self.infer["success"].ns += insert_ns
            if self.summaries:
                self.summaries["cache_miss"].observe(time.monotonic_ns(), (lookup_ns + insert_ns) / 1000)

    def record_first_response(self, ns: int) -> None:
        """Time from arrival to a request's first response (its only one, unless decoupled)."""
        if self.first_response is not None:
            with self.lock:
                self.first_response.observe(ns / 1e6)

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        with self.lock:
            self.infer["fail"].add(total_ns)
            self.failures[reason] += 1

    @property
    def metric_labels(self) -> dict[str, str]:
        """The labels of this version's metrics: its `metric_tags`, then model and version."""
        return {**self.tags, "model": self.name, "version": self.version}

    def summary_rows(self, now_ns: int) -> list[tuple[str, list[tuple[float, float]], int, float]]:
        """(field, [(quantile, µs)], count, sum µs) of each summary; [] when summaries are off."""
        with self.lock:
            return [(key, summary.quantiles(now_ns, self.latency.quantiles), summary.count, summary.sum)
                    for key, summary in self.summaries.items()]

    def histogram_rows(self) -> tuple[list[tuple[str, int]], int, float] | None:
        """(cumulative buckets, count, sum ms) of the first-response histogram; None when off."""
        if self.first_response is None:
            return None
        with self.lock:
            return self.first_response.cumulative(), self.first_response.count, self.first_response.sum

    def watch_recent(self, on: bool) -> None:
        """Keep (on) or stop keeping and drop (off) the latest requests' latencies."""
        with self.lock:
            if not on:
                self.recent = None
            elif self.recent is None:
                self.recent = deque(maxlen=RECENT_MAX_REQUESTS)

    def recent_since(self, since_ns: int) -> list[RecentRequest]:
        """The kept requests that ended at or after `since_ns` (monotonic), oldest first."""
        with self.lock:
            if not self.recent:
                return []
            rows = list(self.recent)
        return rows[bisect.bisect_left(rows, (since_ns,)):]

    def batch_counts(self) -> dict[int, int]:
        """Executions by batch size, since the load."""
        with self.lock:
            return {size: phases["compute_infer"].count for size, phases in self.batches.items()}

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(self.infer["success"].count, dict(self.failures), self.inference_count,
                            self.execution_count, {key: d.ns for key, d in self.infer.items()},
                            self.infer["cache_hit"].count, self.infer["cache_miss"].count)

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {k: d.as_dict() for k, d in self.infer.items()},
                "response_stats": {},
                "batch_stats": [
                    {"batch_size": size, **{k: d.as_dict() for k, d in phases.items()}}
                    for size, phases in sorted(self.batches.items())
                ],
                "memory_usage": [],
            }
