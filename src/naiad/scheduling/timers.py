"""One thread that runs callbacks at monotonic deadlines: queue delays and timeouts of schedulers.

Schedulers start batches from whoever has news (see base.PumpedScheduler); the only news nobody
brings is "time passed": a batch that waited its max_queue_delay, a request whose timeout ran out,
a sequence that went idle. Each scheduler keeps at most one timer armed, for the earliest of these.
Callbacks run on the timer thread, one at a time, and must not block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TimerHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A heap of (deadline, callback) served by one daemon thread, started on first use."""

    def __init__(self, name: str = "naiad-timers") -> None:
        self._name = name
        self._heap: list[tuple[int, int, TimerHandle]] = []
        self._order = itertools.count()  # ties run in the order they were armed
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` on the timer thread once time.monotonic_ns() reaches `when_ns`."""
        handle = TimerHandle(callback)
        with self._changed:
            if self._closed:
                return handle
            heapq.heappush(self._heap, (when_ns, next(self._order), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is handle:
                self._changed.notify()  # the new earliest deadline: the thread sleeps too long
        return handle

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._heap.clear()
            self._changed.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    if self._closed:
                        return
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._changed.wait()
                        continue
                    wait_ns = self._heap[0][0] - time.monotonic_ns()
                    if wait_ns <= 0:
                        handle = heapq.heappop(self._heap)[2]
                        break
                    self._changed.wait(wait_ns / 1e9)
            try:
                handle.callback()
            except Exception:  # a scheduler bug must not stop every other scheduler's timers
                log.exception("timer callback failed")
