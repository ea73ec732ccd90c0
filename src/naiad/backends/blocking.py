"""Run a batch through the non-blocking instance contract and wait for its answers.

For code that drives an instance outside any scheduler: model warm-up before the instance
serves, tools and tests. Not for serving: it blocks the calling thread and takes over the
instance's room callback.
"""

from __future__ import annotations

import threading
import time

from naiad.backends.base import Batch, BatchSender, ExecutionTimes, ModelInstance, Outputs, RequestResult
from naiad.errors import Unavailable


def execute_blocking(instance: ModelInstance, batch: Batch, timeout: float = 300.0) -> list[RequestResult]:
    """Each request's final result, in order (a flags-only final answer counts as no outputs).
    While the instance has no room (a model process restarting) this waits for it, up to
    `timeout` seconds in all; Unavailable results when the time runs out."""
    deadline = time.monotonic() + timeout
    room = threading.Event()
    instance.set_on_room(room.set)
    collector = _Collector(len(batch.requests))
    while not instance.submit(batch, collector):
        if not room.wait(max(deadline - time.monotonic(), 0.0)):
            return [Unavailable(f"the instance had no room within {timeout:g} s")] * len(batch.requests)
        room.clear()
    if not collector.done.wait(max(deadline - time.monotonic(), 0.0)):
        collector.close_open(Unavailable(f"no answer within {timeout:g} s"))
    return collector.results


class _Collector(BatchSender):
    def __init__(self, count: int) -> None:
        self.results: list[RequestResult] = [{} for _ in range(count)]
        self._open = set(range(count))
        self._lock = threading.Lock()
        self.done = threading.Event()
        if not count:
            self.done.set()

    def send(self, index: int, result: Outputs | Exception | None, final: bool) -> None:
        if not final:
            return
        with self._lock:
            if index not in self._open:
                return
            self._open.discard(index)
            self.results[index] = result if result is not None else {}
            if not self._open:
                self.done.set()

    def executed(self, times: ExecutionTimes) -> None:
        pass

    def close_open(self, error: Exception | None) -> None:
        with self._lock:
            remaining = sorted(self._open)
        for index in remaining:
            self.send(index, error, True)
