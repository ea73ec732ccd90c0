"""The server side of one Python model instance's custom metrics (pb_utils.MetricFamily / Metric).

The model process sends its changes as `CustomMetrics` messages (see pb_metrics); `InstanceMetrics`
applies them to the server's registry (`naiad.observability.custom_metrics`) on behalf of that
process, answers `MetricValue` questions, and sends a `MetricRejected` back for what the registry
refuses (the model raises it at the next use).

What a process holds goes with it:
- unload (`close()`): everything the instance's process held is let go; a series nobody else
  holds leaves /metrics (a reload keeps it: the new version takes it before the old one unloads);
- a model process that died and was restarted: its first message is applied first, then what the
  dead process held is let go. Series the new process created again during initialize keep
  their values (a counter does not drop to zero because a model process crashed); the others go.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from naiad.backends.python import messages as p
from naiad.errors import NaiadError
from naiad.observability.custom_metrics import CustomMetricError, CustomMetrics, Family, Series

log = logging.getLogger("naiad.backends.python")


class _Holder:
    """The registry's token for one model process of an instance."""

    __slots__ = ("epoch", "name")

    def __init__(self, name: str, epoch: int) -> None:
        self.name = name
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"<model process of '{self.name}' ({self.epoch:x})>"


class InstanceMetrics:
    """Applies one instance's custom-metric messages to the server's registry (None: the server
    offers none, and the changes are dropped)."""

    def __init__(self, registry: CustomMetrics | None, instance: str) -> None:
        self._registry = registry
        self._instance = instance
        self._lock = threading.Lock()
        self._holder: _Holder | None = None
        self._families: dict[str, Family] = {}
        self._series: dict[int, Series] = {}
        self._refused: dict[str | int, str] = {}  # family name or series id -> why the registry refused it
        self._closed = False

    @classmethod
    def for_host(cls, host: Any, instance: str) -> InstanceMetrics:
        registry = getattr(host, "custom_metrics", None)
        return cls(registry() if callable(registry) else None, instance)

    def handle(self, message: p.CustomMetrics | p.MetricValue, process: Any) -> None:
        """Apply `message` from the instance's model process; answers and rejections go back
        through `process` (its `send`)."""
        if isinstance(message, p.MetricValue):
            _send(process, self._value(message))
            return
        for rejected in self._apply(message):
            _send(process, rejected)

    def _value(self, message: p.MetricValue) -> p.Answer:
        with self._lock:
            series = self._series.get(message.series)
            refused = self._refused.get(message.series)
        if self._registry is None or series is None:
            return p.Answer(message.call, None, refused or "the metric is not known to the server")
        return p.Answer(message.call, self._registry.value(series))

    def _apply(self, message: p.CustomMetrics) -> list[p.MetricRejected]:
        registry = self._registry
        if registry is None:
            return []
        with self._lock:
            if self._closed:
                return []
            previous = None
            if self._holder is None or self._holder.epoch != message.epoch:
                previous, self._holder = self._holder, _Holder(self._instance, message.epoch)
                self._families, self._series, self._refused = {}, {}, {}
            holder = self._holder
            rejected = [r for change in message.changes if (r := self._change(registry, holder, change)) is not None]
        if previous is not None:
            registry.release_holder(previous)  # after the new process took what it wants to keep
        return rejected

    def _change(self, registry: CustomMetrics, holder: _Holder, change: p.MetricChange) -> p.MetricRejected | None:
        if isinstance(change, p.MetricSeriesUpdated):
            series = self._series.get(change.series)
            if series is not None:
                registry.update(series, change.add, change.set_value, change.set_ns, change.bucket_adds,
                                change.sum_add)
            return None
        if isinstance(change, p.MetricSeriesAcquired):
            family = self._families.get(change.family)
            if family is None:  # its family was refused: the model heard of that already
                self._refused[change.series] = self._refused.get(change.family, "unknown metric family")
                return None
            try:
                self._series[change.series] = registry.acquire(holder, family, change.labels, change.buckets)
            except CustomMetricError as error:
                return self._refuse(change.family, change.series, f"Error when creating Metric: {error}")
            return None
        if isinstance(change, p.MetricSeriesReleased):
            released = self._series.pop(change.series, None)
            if released is not None:
                registry.release(holder, released)
            return None
        try:
            self._families[change.name] = registry.declare(holder, change.name, change.description, change.kind)
        except CustomMetricError as error:
            self._families.pop(change.name, None)
            return self._refuse(change.name, 0, f"Error when creating MetricFamily: {error}")
        return None

    def _refuse(self, family: str, series: int, error: str) -> p.MetricRejected:
        log.error("model instance '%s': %s", self._instance, error)
        self._refused[series or family] = error
        return p.MetricRejected(family, series, error)

    def close(self) -> None:
        """The instance unloads: let go of everything its model process held."""
        with self._lock:
            self._closed = True
            holder, self._holder = self._holder, None
            self._families, self._series, self._refused = {}, {}, {}
        if holder is not None and self._registry is not None:
            self._registry.release_holder(holder)


def _send(process: Any, message: Any) -> None:
    if process is None:
        return
    with contextlib.suppress(p.ChannelClosed, NaiadError):
        process.send(message)
