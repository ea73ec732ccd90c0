"""The in-process ceiling: how many rows/s onnxruntime itself computes, with no server in the way.

The same model file and the same session settings as the servers (1 intra-op thread, 1 inter-op
thread, all graph optimisations), one session per instance the servers get, each driven by its
own thread (onnxruntime releases the GIL) with ready-made input arrays of one batch size. The
best rows/s over the batch sizes tried is what a server of that many instances could at most
serve; a server's throughput divided by it says how much of the machine the serving costs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

Feeds = Callable[[int], dict[str, np.ndarray]]


@dataclass
class CeilingRow:
    """One batch size: rows/s summed over the sessions, and the mean latency of one call."""

    batch: int
    rows_per_s: float
    call_ms: float
    calls: int


def make_session(path: Path) -> ort.InferenceSession:
    """A session with the servers' settings: 1 intra-op and 1 inter-op thread, CPU."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def _drive(session: ort.InferenceSession, feeds: dict[str, np.ndarray], seconds: float, min_calls: int,
           start: threading.Barrier, out: list[tuple[int, float]]) -> None:
    """Call ``session.run`` until ``seconds`` have passed and ``min_calls`` are done."""
    session.run(None, feeds)  # warm-up: first-call allocations are not part of the rate
    start.wait()
    calls, t0 = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - t0 < seconds:
        session.run(None, feeds)
        calls += 1
    out.append((calls, time.perf_counter() - t0))


def measure_batch(sessions: list[ort.InferenceSession], feeds: dict[str, np.ndarray], batch: int,
                  seconds: float, min_calls: int = 3) -> CeilingRow:
    """Run every session concurrently on ``feeds`` (``batch`` rows) and sum their rows/s."""
    start = threading.Barrier(len(sessions))
    results: list[tuple[int, float]] = []
    threads = [threading.Thread(target=_drive, args=(s, feeds, seconds, min_calls, start, results))
               for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows_per_s = sum(calls * batch / elapsed for calls, elapsed in results)
    calls = sum(c for c, _ in results)
    call_ms = sum(elapsed * 1e3 / c for c, elapsed in results) / len(results)
    return CeilingRow(batch, rows_per_s, call_ms, calls)


def measure_ceiling(path: Path, feeds: Feeds, instances: int, batches: list[int],
                    seconds: float) -> list[CeilingRow]:
    """rows/s of ``instances`` concurrent sessions at each batch size in ``batches``."""
    sessions = [make_session(path) for _ in range(instances)]
    return [measure_batch(sessions, feeds(batch), batch, seconds) for batch in batches]


def best(rows: list[CeilingRow]) -> CeilingRow:
    """The batch size with the highest rows/s."""
    return max(rows, key=lambda row: row.rows_per_s)


class Probe:
    """The ceiling at one batch size, re-measured right next to each server measurement.

    Other jobs on this shared machine change how much CPU a compute-bound model gets from one
    minute to the next; a ceiling measured seconds before and after a perf_analyzer run saw
    the same machine that run did.
    """

    def __init__(self, path: Path, feeds: Feeds, instances: int, batch: int, seconds: float) -> None:
        self.sessions = [make_session(path) for _ in range(instances)]
        self.feeds = feeds(batch)
        self.batch = batch
        self.seconds = seconds
        self.last: float | None = None

    def measure(self) -> float:
        """rows/s now (and remember it as the next measurement's "before")."""
        self.last = measure_batch(self.sessions, self.feeds, self.batch, self.seconds).rows_per_s
        return self.last
