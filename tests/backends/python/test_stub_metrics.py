"""The model process's sending of custom-metric changes: ahead of the next message, or on their own
shortly after they start waiting."""

from __future__ import annotations

import socket

from backends.python.pb_fakes import FakeRuntime

from naiad.backends.python import messages as p
from naiad.backends.python import pb_utils
from naiad.backends.python.stub_metrics import MetricsSender


def test_changes_ride_ahead_of_the_next_message_or_go_on_their_own() -> None:
    ours, theirs = socket.socketpair()
    server = p.Channel(theirs)
    sender = MetricsSender(p.Channel(ours), lambda: False)

    class Runtime(FakeRuntime):
        def metrics_changed(self) -> None:
            sender.changed()

    pb_utils._set_runtime(Runtime())
    family = pb_utils.MetricFamily("t_sender", "s", pb_utils.MetricFamily.COUNTER)
    counter = family.Metric()
    counter.increment(2)
    sender.send([p.Frees([])])
    first, second = server.recv(), server.recv()
    assert isinstance(first, p.CustomMetrics) and first.epoch == sender.epoch
    assert [type(change).__name__ for change in first.changes] == [
        "MetricFamilyDeclared", "MetricSeriesAcquired", "MetricSeriesUpdated"]
    assert first.changes[2] == p.MetricSeriesUpdated(counter._series.id, 2.0)
    assert second == p.Frees([])
    counter.increment(3)  # nothing else goes out: the flusher sends it
    server.sock.settimeout(5)
    alone = server.recv()
    assert isinstance(alone, p.CustomMetrics) and alone.changes == [p.MetricSeriesUpdated(counter._series.id, 3.0)]
    ours.close()
    theirs.close()
