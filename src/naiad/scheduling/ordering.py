"""preserve_ordering: responses leave in arrival order, whichever instance finishes first."""

from __future__ import annotations

import threading
from collections.abc import Callable

from naiad.scheduling.base import ResponseSink
from naiad.types import InferResponse


class InOrder:
    """Numbers the sinks of a scheduler's jobs and lets each response out only after every
    response of the jobs numbered before it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_stamp = 0
        self._next_out = 0
        self._ready: dict[int, Callable[[], None]] = {}

    def stamp(self, sink: ResponseSink) -> OrderedSink:
        with self._lock:
            number = self._next_stamp
            self._next_stamp += 1
        return OrderedSink(self, number, sink)

    def skip(self, sink: ResponseSink) -> None:
        """A job that will never be answered gives up its turn."""
        if isinstance(sink, OrderedSink) and sink.order is self:
            self.deliver(sink.number, _nothing)

    def deliver(self, number: int, send: Callable[[], None]) -> None:
        with self._lock:
            self._ready[number] = send
            due = []
            while self._next_out in self._ready:
                due.append(self._ready.pop(self._next_out))
                self._next_out += 1
        for send_now in due:
            send_now()


class OrderedSink:
    """A job's sink whose response waits for its turn (preserve_ordering is for models that
    answer each request once)."""

    __slots__ = ("number", "order", "sink")

    def __init__(self, order: InOrder, number: int, sink: ResponseSink) -> None:
        self.order = order
        self.number = number
        self.sink = sink

    def __call__(self, response: InferResponse) -> None:
        sink = self.sink
        self.order.deliver(self.number, lambda: sink(response))


def _nothing() -> None:
    pass
