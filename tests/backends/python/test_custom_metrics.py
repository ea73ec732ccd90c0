"""The server side of an instance's custom metrics: a model process's changes applied to the
server's registry, answers to value questions, refusals sent back, and what a restarted process
or an unload does to the series."""

from __future__ import annotations

from typing import Any

from naiad.backends.python import messages as p
from naiad.backends.python.custom_metrics import InstanceMetrics
from naiad.observability.custom_metrics import CustomMetrics


class Process:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


def declare(name: str, kind: str = "counter") -> p.MetricFamilyDeclared:
    return p.MetricFamilyDeclared(name, f"{name} help", kind)


def page(registry: CustomMetrics) -> list[str]:
    return [line for line in registry.render() if not line.startswith("#")]


def test_changes_apply_in_order_and_values_are_answered() -> None:
    registry, process = CustomMetrics(), Process()
    instance = InstanceMetrics(registry, "m_0")
    instance.handle(p.CustomMetrics(1, [
        declare("hits"), p.MetricSeriesAcquired(1, "hits", {"route": "a"}),
        p.MetricSeriesUpdated(1, add=3.0), p.MetricSeriesUpdated(1, add=1.5)]), process)
    instance.handle(p.MetricValue(7, 1), process)
    instance.handle(p.MetricValue(8, 99), process)
    assert process.sent == [p.Answer(7, 4.5), p.Answer(8, None, "the metric is not known to the server")]
    assert page(registry) == ['hits{route="a"} 4.5']
    instance.handle(p.CustomMetrics(1, [p.MetricSeriesReleased(1)]), process)
    assert page(registry) == []


def test_two_instances_share_a_series_and_refusals_go_back() -> None:
    registry, first_process, second_process = CustomMetrics(), Process(), Process()
    first, second = InstanceMetrics(registry, "a_0"), InstanceMetrics(registry, "b_0")
    first.handle(p.CustomMetrics(1, [declare("shared"), p.MetricSeriesAcquired(1, "shared", {}),
                                     p.MetricSeriesUpdated(1, add=2)]), first_process)
    second.handle(p.CustomMetrics(2, [declare("shared"), p.MetricSeriesAcquired(5, "shared", {}),
                                      p.MetricSeriesUpdated(5, add=3), declare("shared_kind", "gauge")]),
                  second_process)
    assert page(registry) == ["shared 5"]
    # the first instance's process did not know the second made "shared_kind" a gauge
    first.handle(p.CustomMetrics(1, [declare("shared_kind"), p.MetricSeriesAcquired(2, "shared_kind", {}),
                                     p.MetricSeriesUpdated(2, add=1)]), first_process)
    refusal = "Error when creating MetricFamily: a metric family named 'shared_kind' already exists with kind GAUGE"
    assert first_process.sent == [p.MetricRejected("shared_kind", 0, refusal)]
    first.handle(p.MetricValue(1, 2), first_process)
    assert first_process.sent[-1] == p.Answer(1, None, refusal)
    assert page(registry) == ["shared 5"]  # a gauge family without series prints nothing
    first.close()
    assert page(registry) == ["shared 5"]  # the other instance holds it still
    first.handle(p.CustomMetrics(1, [p.MetricSeriesUpdated(1, add=100)]), first_process)  # late: ignored
    assert page(registry) == ["shared 5"]
    second.close()
    assert page(registry) == [] and registry.families() == []


def test_a_restarted_process_keeps_what_it_creates_again() -> None:
    registry, process = CustomMetrics(), Process()
    instance = InstanceMetrics(registry, "m_0")
    instance.handle(p.CustomMetrics(1, [
        declare("starts"), p.MetricSeriesAcquired(1, "starts", {}), p.MetricSeriesUpdated(1, add=1),
        declare("made_later"), p.MetricSeriesAcquired(2, "made_later", {}), p.MetricSeriesUpdated(2, add=9)]), process)
    # the process died; the new one (another epoch) creates "starts" again in initialize
    instance.handle(p.CustomMetrics(2, [declare("starts"), p.MetricSeriesAcquired(1, "starts", {}),
                                        p.MetricSeriesUpdated(1, add=1)]), process)
    assert page(registry) == ["starts 2"]
    instance.close()
    assert page(registry) == []


def test_without_a_registry_changes_are_dropped() -> None:
    process = Process()
    instance = InstanceMetrics.for_host(None, "m_0")
    instance.handle(p.CustomMetrics(1, [declare("x"), p.MetricSeriesAcquired(1, "x", {})]), process)
    instance.handle(p.MetricValue(3, 1), process)
    assert process.sent == [p.Answer(3, None, "the metric is not known to the server")]
    instance.close()
