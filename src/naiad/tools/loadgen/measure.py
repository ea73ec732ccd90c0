"""Measurement windows until the figures are stable, as perf_analyzer takes them.

A window lasts `interval_s` (and, in count mode, until `request_count` requests were answered).
After each, the last `stable_windows` windows are compared: when each one's throughput and latency
(the average, or `stability_percentile` when set, as perf_analyzer's `--percentile`) lie within
`stability_pct` % of their mean, the measurement is stable and their merged
figures are the result; after `max_trials` windows the last ones are merged anyway, marked
unstable. The server's statistics are read around every window for the server-side split.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from naiad.tools.loadgen.load import Recorder
from naiad.tools.loadgen.stats import ServerSplit, StatsSnapshot, snapshot, split

#: stats() -> the statistics extension's answer for the model, or None.
StatsSource = Callable[[], Awaitable[dict[str, Any] | None]]
#: progress(window_index, window, settings) after each window.
Progress = Callable[[int, "Window", "WindowSettings"], None]


class MeasureError(RuntimeError):
    """Every request of a window failed: the message is the first error."""


@dataclass(frozen=True, slots=True)
class WindowSettings:
    interval_s: float = 5.0
    request_count: int = 0  # count mode: a window also waits for this many answers (at most 10 intervals)
    stability_pct: float = 10.0
    max_trials: int = 10
    stable_windows: int = 3
    stability_percentile: float | None = None  # None: stabilize on the average latency


@dataclass(frozen=True, slots=True)
class Window:
    duration_s: float
    latencies_ns: list[int]  # sorted
    errors: int
    cpu_s: float  # this process's CPU time over the window
    server: ServerSplit | None

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ns) / self.duration_s if self.duration_s > 0 else 0.0

    def percentile_us(self, p: float) -> float:
        return percentile(self.latencies_ns, p) / 1000.0

    @property
    def avg_us(self) -> float:
        return sum(self.latencies_ns) / len(self.latencies_ns) / 1000.0 if self.latencies_ns else 0.0


def percentile(sorted_ns: list[int], p: float) -> float:
    """The p-th percentile of sorted values (nearest rank, as perf_analyzer); 0 when empty."""
    if not sorted_ns:
        return 0.0
    rank = min(len(sorted_ns) - 1, max(0, round(p / 100.0 * len(sorted_ns)) - 1))
    return float(sorted_ns[rank])


@dataclass(slots=True)
class Measurement:
    """The figures of one load level (a concurrency or a request rate)."""

    mode: str  # "concurrency" or "request_rate"
    level: float
    batch_size: int
    requests: int
    errors: int
    duration_s: float
    stable: bool
    latencies_ns: list[int] = field(repr=False)
    window_throughputs: list[float]
    client_cpu_s: float
    server: ServerSplit | None = None
    delayed: int = 0
    first_error: str = ""

    @property
    def request_throughput(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Inferences per second (requests x batch size), perf_analyzer's headline."""
        return self.request_throughput * self.batch_size

    def latency_us(self, p: float) -> float:
        return percentile(self.latencies_ns, p) / 1000.0

    @property
    def avg_latency_us(self) -> float:
        return sum(self.latencies_ns) / len(self.latencies_ns) / 1000.0 if self.latencies_ns else 0.0

    @property
    def client_cpu_us_per_request(self) -> float:
        return self.client_cpu_s * 1e6 / self.requests if self.requests else 0.0


def is_stable(windows: list[Window], pct: float, latency_percentile: float | None = None) -> bool:
    """Each window's throughput and latency (average, or that percentile) within `pct` % of the
    windows' mean."""

    def latency(w: Window) -> float:
        return w.avg_us if latency_percentile is None else w.percentile_us(latency_percentile)

    for value in (lambda w: w.requests_per_s, latency):
        values = [value(w) for w in windows]
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(v - mean) > mean * pct / 100.0 for v in values):
            return False
    return True


async def measure(recorder: Recorder, settings: WindowSettings, stats: StatsSource | None, model: str,
                  mode: str, level: float, batch_size: int, progress: Progress | None = None,
                  delayed: Callable[[], int] | None = None) -> Measurement:
    """Take windows of the load already running until stable (or `max_trials`), and merge the last."""
    windows: list[Window] = []
    recorder.take()  # what came before the first window (ramp-up) is not measured
    delayed_before = delayed() if delayed else 0
    stable = False
    for index in range(settings.max_trials):
        window = await _window(recorder, settings, stats, model)
        windows.append(window)
        if progress is not None:
            progress(index, window, settings)
        if window.errors and not window.latencies_ns:
            raise MeasureError(recorder.first_error or "every request failed")
        recent = windows[-settings.stable_windows:]
        if len(recent) == settings.stable_windows and is_stable(recent, settings.stability_pct,
                                                                 settings.stability_percentile):
            stable = True
            break
    used = windows[-settings.stable_windows:]
    latencies = sorted(lat for w in used for lat in w.latencies_ns)
    return Measurement(
        mode=mode, level=level, batch_size=batch_size,
        requests=len(latencies), errors=sum(w.errors for w in used),
        duration_s=sum(w.duration_s for w in used), stable=stable, latencies_ns=latencies,
        window_throughputs=[w.requests_per_s * batch_size for w in windows],
        client_cpu_s=sum(w.cpu_s for w in used),
        server=ServerSplit.merge([w.server for w in used if w.server is not None]),
        delayed=(delayed() - delayed_before) if delayed else 0,
        first_error=recorder.first_error,
    )


async def _window(recorder: Recorder, settings: WindowSettings, stats: StatsSource | None,
                  model: str) -> Window:
    before = await _snapshot(stats, model)
    recorder.take()
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.sleep(settings.interval_s)
    if settings.request_count:
        deadline = t0 + 10 * settings.interval_s
        while len(recorder.latencies) < settings.request_count and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, settings.interval_s))
    latencies, errors = recorder.take()
    t1, cpu1 = time.monotonic(), time.process_time()
    after = await _snapshot(stats, model)
    latencies.sort()
    server = split(before, after) if before is not None and after is not None else None
    return Window(t1 - t0, latencies, errors, cpu1 - cpu0, server)


async def _snapshot(stats: StatsSource | None, model: str) -> StatsSnapshot | None:
    if stats is None:
        return None
    document = await stats()
    return snapshot(document, model) if document is not None else None
