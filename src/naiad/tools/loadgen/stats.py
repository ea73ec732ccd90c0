"""The server-side split of latency, from the statistics extension (read before and after a window).

The same figures perf_analyzer prints under "Server:": queue, compute input, compute infer and
compute output per request, plus the average batch the server executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Cumulative counters of one model (all its versions) at one instant."""

    inference_count: int = 0
    execution_count: int = 0
    success_count: int = 0
    success_ns: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


@dataclass(frozen=True, slots=True)
class ServerSplit:
    """Averages over the requests the server finished in a window (µs per request)."""

    requests: int
    inferences: int
    executions: int
    server_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def avg_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @classmethod
    def merge(cls, splits: list[ServerSplit]) -> ServerSplit | None:
        """Request-weighted averages of several windows."""
        splits = [s for s in splits if s.requests]
        if not splits:
            return None
        total = sum(s.requests for s in splits)

        def avg(field: str) -> float:
            return sum(getattr(s, field) * s.requests for s in splits) / total

        return cls(total, sum(s.inferences for s in splits), sum(s.executions for s in splits), avg("server_us"),
                   avg("queue_us"), avg("compute_input_us"), avg("compute_infer_us"), avg("compute_output_us"))


def _duration(stats: dict[str, Any], name: str) -> tuple[int, int]:
    """(count, ns) of one StatisticDuration; gRPC's JSON omits zeros and prints int64 as strings."""
    value = stats.get(name) or {}
    return int(value.get("count", 0)), int(value.get("ns", 0))


def snapshot(document: dict[str, Any], model: str) -> StatsSnapshot:
    """Sum the counters of every version of `model` in a `/stats` answer."""
    totals = [0] * 8
    for entry in document.get("model_stats", []):
        if entry.get("name") != model:
            continue
        infer = entry.get("inference_stats") or {}
        success = _duration(infer, "success")
        values = (int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0)), success[0],
                  success[1], _duration(infer, "queue")[1], _duration(infer, "compute_input")[1],
                  _duration(infer, "compute_infer")[1], _duration(infer, "compute_output")[1])
        totals = [t + v for t, v in zip(totals, values, strict=True)]
    return StatsSnapshot(*totals)


def split(before: StatsSnapshot, after: StatsSnapshot) -> ServerSplit | None:
    """What the server did between two snapshots; None when it reports nothing (or restarted the
    counters, as a reloaded model does)."""
    requests = after.success_count - before.success_count
    if requests <= 0 or after.inference_count < before.inference_count:
        return None

    def per_request(field: str) -> float:
        return (getattr(after, field) - getattr(before, field)) / requests / 1000.0

    return ServerSplit(
        requests=requests,
        inferences=after.inference_count - before.inference_count,
        executions=after.execution_count - before.execution_count,
        server_us=per_request("success_ns"),
        queue_us=per_request("queue_ns"),
        compute_input_us=per_request("compute_input_ns"),
        compute_infer_us=per_request("compute_infer_ns"),
        compute_output_us=per_request("compute_output_ns"),
    )
