"""The model process's sending of custom-metric changes (pb_metrics) to the server.

Changes go out ahead of the next message the process sends anyway (an execute's changes ride with
its responses: a client that got its answer and scrapes /metrics sees them), and otherwise within
FLUSH_S, from a thread woken only when changes start waiting. Taking the changes and writing them
happen under one lock, so the server applies them in the order they were made.

Imports only the standard library, msgspec and its sibling modules (it runs in model processes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from naiad.backends.python import messages as p
from naiad.backends.python import pb_metrics

# Changes made outside execute wait this long for another message to ride with.
FLUSH_S = 0.05


class MetricsSender:
    """Sends `messages` after the waiting changes (`send`); flushes on its own when told that
    changes wait (`changed`). `epoch` tells this process from a restarted one of the instance."""

    def __init__(self, channel: p.Channel, stopped: Callable[[], bool]) -> None:
        self._channel = channel
        self._stopped = stopped
        self.epoch = int.from_bytes(os.urandom(8), "little") >> 1
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flusher_lock = threading.Lock()  # not _lock: a Metric's __del__ may run while it is held

    def send(self, messages: list[Any]) -> None:
        with self._lock:
            if pb_metrics.has_changes():
                changes = [_message(change) for change in pb_metrics.take_changes()]
                if changes:
                    messages = [p.CustomMetrics(self.epoch, changes), *messages]
            if messages:
                self._channel.send_many(messages)

    def changed(self) -> None:
        """Changes started waiting: send them soon if no other message takes them first."""
        self._wake.set()
        if self._flusher is None:
            with self._flusher_lock:
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush, name="model-metrics", daemon=True)
                    self._flusher.start()

    def _flush(self) -> None:
        while not self._stopped():
            self._wake.wait()
            time.sleep(FLUSH_S)  # an execute's answer usually takes them first
            self._wake.clear()  # before taking: a change made after this wakes the next round
            try:
                self.send([])
            except p.ChannelClosed:
                return


def _message(change: pb_metrics.Change) -> p.MetricChange:
    if isinstance(change, pb_metrics.SeriesUpdated):
        return p.MetricSeriesUpdated(*change)
    if isinstance(change, pb_metrics.SeriesAcquired):
        return p.MetricSeriesAcquired(*change)
    if isinstance(change, pb_metrics.SeriesReleased):
        return p.MetricSeriesReleased(*change)
    return p.MetricFamilyDeclared(*change)
