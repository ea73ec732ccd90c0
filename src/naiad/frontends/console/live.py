"""The console's live data: one JSON document per poll, made from counters the server keeps.

Counters (successes, failures by reason, inferences, executions by batch size, phase times, cache
hits, LLM tokens and latency histograms) are cumulative: the page takes differences between two
polls for its rates, so a poll adds no work to any request.

p50 / p99 cannot come from sums. While a console polls, each loaded version keeps its latest
requests' latencies in a bounded deque (`ModelStatistics.watch_recent`, at most
RECENT_MAX_REQUESTS each); a poll reads the last WINDOW_S seconds of it. When no console has
polled for IDLE_S seconds the deques are dropped, and requests are back to paying one attribute
test. The alternative, a latency histogram always updated, would cost every request a bucket
search whether anyone looks or not.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from naiad.core.server import InferenceServer
from naiad.frontends.console.system import SystemSampler
from naiad.observability.metrics import MetricRow, ModelSample

#: The quantiles are over the requests of the last WINDOW_S seconds.
WINDOW_S = 5.0
#: A console that has not polled for this long is closed: the latency windows go.
IDLE_S = 10.0
#: The LLM backend's rows the console reads (observability rows of backends/llm.py)
_LLM_COUNTERS = {"nv_llm_prompt_tokens": "prompt_tokens", "nv_llm_generation_tokens": "generation_tokens",
                 "nv_llm_preemptions": "preemptions"}
_LLM_GAUGES = {"nv_llm_kv_cache_usage": "kv_cache_usage", "nv_llm_prefix_cache_hit_rate": "prefix_cache_hit_rate"}
_LLM_HISTOGRAMS = {"nv_llm_time_to_first_token_seconds": "ttft", "nv_llm_inter_token_latency_seconds": "itl"}


class LiveStats:
    """Builds the live document and keeps the latency windows open while it is asked for."""

    def __init__(self, server: InferenceServer, gpu: bool = False) -> None:
        self.server = server
        self.system = SystemSampler(gpu)
        self.watching = False
        self._last_poll = 0.0
        self._idle_check: asyncio.TimerHandle | None = None

    def document(self) -> dict[str, Any]:
        """The live data now; opens the latency windows of every loaded version."""
        self._last_poll = time.monotonic()
        samples = self.server.metric_samples()
        for sample in samples:
            if sample.stats.recent is None:
                sample.stats.watch_recent(True)
        if not self.watching:
            self.watching = True
            self._schedule_idle_check()
        since = time.monotonic_ns() - int(WINDOW_S * 1e9)
        return {
            "time_ms": time.time_ns() // 1_000_000,
            "window_s": WINDOW_S,
            "control_mode": self.server.options.model_control_mode,
            "models": [_model(sample, since) for sample in sorted(samples, key=_order)],
            "system": self.system.sample(),
        }

    def stop_watching(self) -> None:
        self.watching = False
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        for sample in self.server.metric_samples():
            sample.stats.watch_recent(False)

    def _schedule_idle_check(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off a loop (tests): nothing closes the windows by time
            return
        self._idle_check = loop.call_later(IDLE_S, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_check = None
        idle = time.monotonic() - self._last_poll
        if idle >= IDLE_S:
            self.stop_watching()
        else:
            self._idle_check = asyncio.get_running_loop().call_later(IDLE_S - idle, self._check_idle)


def _order(sample: ModelSample) -> tuple[str, str]:
    return sample.stats.name, sample.stats.version


def _model(sample: ModelSample, since_ns: int) -> dict[str, Any]:
    stats = sample.stats
    snap = stats.snapshot()
    entry: dict[str, Any] = {
        "name": stats.name,
        "version": stats.version,
        "success": snap.success,
        "failures": snap.failures,
        "inferences": snap.inference_count,
        "executions": snap.execution_count,
        "ns": snap.durations_ns,
        "batches": sorted(stats.batch_counts().items()),
        "cache": {"hits": snap.cache_hits, "misses": snap.cache_misses} if stats.cache_enabled else None,
        "pending": sample.pending,
        "latency": _quantiles(stats.recent_since(since_ns)),
    }
    llm = _llm(sample.extra)
    if llm is not None:
        entry["llm"] = llm
    return entry


def _quantiles(rows: list[tuple[int, int, int, int]]) -> dict[str, Any] | None:
    """p50 and p99 in ns of total, queue and compute time over `rows`; None without any."""
    if not rows:
        return None
    values = np.asarray(rows, dtype=np.int64)[:, 1:]
    p50, p99 = np.percentile(values, [50, 99], axis=0)
    return {"count": len(rows),
            **{key: [float(p50[i]), float(p99[i])] for i, key in enumerate(("total", "queue", "compute"))}}


def _llm(rows: tuple[MetricRow, ...]) -> dict[str, Any] | None:
    """An LLM model's figures, summed (counters, histograms) or averaged (gauges) over its
    instances; None for other backends."""
    if not any(row.name in _LLM_COUNTERS for row in rows):
        return None
    llm: dict[str, Any] = dict.fromkeys(_LLM_COUNTERS.values(), 0)
    gauges: dict[str, list[float]] = {}
    for row in rows:
        if row.name in _LLM_COUNTERS:
            llm[_LLM_COUNTERS[row.name]] += row.value
        elif row.name in _LLM_GAUGES:
            gauges.setdefault(_LLM_GAUGES[row.name], []).append(row.value)
        elif row.name in _LLM_HISTOGRAMS:
            _add_histogram(llm, _LLM_HISTOGRAMS[row.name], row)
    llm.update({key: sum(values) / len(values) for key, values in gauges.items()})
    return llm


def _add_histogram(llm: dict[str, Any], key: str, row: MetricRow) -> None:
    """Cumulative [upper bound (s, None for +Inf), count] pairs and the sum, added up."""
    buckets = [[None if bound == "+Inf" else float(bound), count] for bound, count in row.buckets]
    held = llm.get(key)
    if held is None:
        llm[key] = {"buckets": buckets, "sum": row.value}
        return
    for mine, theirs in zip(held["buckets"], buckets, strict=False):
        mine[1] += theirs[1]
    held["sum"] += row.value
