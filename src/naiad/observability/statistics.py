"""Per model-version statistics in the shape of Triton's statistics extension (SPEC §6)."""

from __future__ import annotations

import threading
import time
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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters the metrics page prints, read at once under the lock."""

    success: int
    failures: dict[str, int]
    inference_count: int
    execution_count: int
    durations_ns: dict[str, int]


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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of `batch_size` inferences, with its compute phases in ns."""
        with self.lock:
            self.execution_count += 1
            self.inference_count += batch_size
            self.last_inference_ms = time.time_ns() // 1_000_000
            by_size = self.batches.get(batch_size)
            if by_size is None:
                by_size = self.batches[batch_size] = {k: Duration() for k in _BATCH_FIELDS}
            for key, ns in zip(_BATCH_FIELDS, (input_ns, infer_ns, output_ns), strict=True):
                by_size[key].add(ns)

    def record_request(self, ok: bool, total_ns: int, queue_ns: int, compute: tuple[int, int, int],
                       reason: str = "BACKEND") -> None:
        """One request's outcome; compute holds its share of (input, infer, output) ns; a failed
        one counts under `reason`."""
        with self.lock:
            if not ok:
                self.infer["fail"].add(total_ns)
                self.failures[reason] += 1
                return
            self.infer["success"].add(total_ns)
            self.infer["queue"].add(queue_ns)
            for key, ns in zip(_BATCH_FIELDS, compute, strict=True):
                self.infer[key].add(ns)

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        with self.lock:
            self.infer["fail"].add(total_ns)
            self.failures[reason] += 1

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(self.infer["success"].count, dict(self.failures), self.inference_count,
                            self.execution_count, {key: d.ns for key, d in self.infer.items()})

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
