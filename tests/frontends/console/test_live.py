"""The console's live document, built from a server's counters: figures, quantiles over the
recent window, LLM rows merged over instances, and windows that close when nobody polls."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from naiad.core.server import InferenceServer
from naiad.frontends.console import live
from naiad.frontends.console.live import LiveStats
from naiad.observability.metrics import MetricRow, ModelSample
from naiad.observability.statistics import ModelStatistics


class _Server:
    """What LiveStats reads of InferenceServer: its samples and its control mode."""

    def __init__(self, samples: list[ModelSample]) -> None:
        self.samples = samples
        self.options = SimpleNamespace(model_control_mode="explicit")

    def metric_samples(self) -> list[ModelSample]:
        return self.samples


def _live(samples: list[ModelSample]) -> LiveStats:
    return LiveStats(cast(InferenceServer, _Server(samples)))


def test_counters_and_latency_quantiles() -> None:
    stats = ModelStatistics("simple", "1")
    stats.record_execution(4, 1, 2, 3)
    stats.record_failure(10, "REJECTED")
    stats.record_request(True, 9_000, 1_000, (0, 0, 0))
    console = _live([ModelSample(stats, pending=3)])
    first = console.document()
    (model,) = first["models"]
    assert model["name"] == "simple" and model["version"] == "1"
    assert model["success"] == 1 and model["failures"]["REJECTED"] == 1
    assert model["batches"] == [(4, 1)]
    assert model["pending"] == 3 and model["cache"] is None
    assert model["latency"] is None  # the request came before anyone watched
    assert first["control_mode"] == "explicit"
    for total in range(1, 101):  # 1..100 µs
        stats.record_request(True, total * 1000, 500, (total * 100, 0, 0))
    latency = console.document()["models"][0]["latency"]
    assert latency["count"] == 100
    assert latency["total"][0] == pytest.approx(50_500, rel=0.01)
    assert latency["total"][1] == pytest.approx(99_010, rel=0.01)
    assert latency["queue"] == [500.0, 500.0]
    assert latency["compute"][1] == pytest.approx(9_901, rel=0.01)


def test_the_window_covers_the_last_seconds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = ModelStatistics("m", "1")
    console = _live([ModelSample(stats, 0)])
    console.document()
    stats.record_request(True, 1000, 0, (0, 0, 0))
    monkeypatch.setattr(live, "WINDOW_S", 0.05)
    time.sleep(0.1)
    assert console.document()["models"][0]["latency"] is None


def test_system_figures() -> None:
    system = _live([]).document()["system"]
    assert system["cores"] >= 1
    assert 0 <= system["cpu"] <= 1
    assert system["memory_total"] >= system["memory_used"] > 0
    assert system["process_rss"] > 0 and system["processes"] >= 1
    assert system["process_cpu_s"] > 0
    assert system["gpus"] == []


def _llm_rows(prompt: int, generated: int, kv: float, ttft: list[tuple[str, int]]) -> tuple[MetricRow, ...]:
    return (
        MetricRow("nv_llm_prompt_tokens", "counter", "", prompt),
        MetricRow("nv_llm_generation_tokens", "counter", "", generated),
        MetricRow("nv_llm_time_to_first_token_seconds", "histogram", "", 0.5, buckets=tuple(ttft)),
        MetricRow("nv_llm_kv_cache_usage", "gauge", "", kv),
        MetricRow("nv_llm_prefix_cache_hit_rate", "gauge", "", 0.5),
        MetricRow("nv_llm_preemptions", "counter", "", 1),
    )


def test_llm_rows_are_added_over_instances() -> None:
    rows = (_llm_rows(10, 100, 0.2, [("0.1", 1), ("+Inf", 2)])
            + _llm_rows(5, 50, 0.4, [("0.1", 3), ("+Inf", 3)]))
    (model,) = _live([ModelSample(ModelStatistics("llm", "1"), 0, rows)]).document()["models"]
    llm: dict[str, Any] = model["llm"]
    assert llm["prompt_tokens"] == 15 and llm["generation_tokens"] == 150 and llm["preemptions"] == 2
    assert llm["kv_cache_usage"] == pytest.approx(0.3)
    assert llm["ttft"] == {"buckets": [[0.1, 4], [None, 5]], "sum": 1.0}
    assert "itl" not in llm  # no such rows: none made up


def test_other_backends_have_no_llm_section() -> None:
    (model,) = _live([ModelSample(ModelStatistics("m", "1"), 0)]).document()["models"]
    assert "llm" not in model


def test_windows_stay_open_while_polled_and_close_when_idle() -> None:
    stats = ModelStatistics("m", "1")
    console = _live([ModelSample(stats, 0)])

    async def check() -> None:
        console.document()
        assert console.watching and stats.recent is not None
        console._check_idle()  # polled just now: stays open, checks again later
        assert stats.recent is not None and console._idle_check is not None
        console._last_poll -= live.IDLE_S + 1
        console._check_idle()
        assert stats.recent is None and not console.watching

    asyncio.run(check())


def test_the_idle_timer_closes_the_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "IDLE_S", 0.05)
    stats = ModelStatistics("m", "1")
    console = _live([ModelSample(stats, 0)])

    async def poll_once_then_wait() -> None:
        console.document()
        deadline = time.monotonic() + 10
        while stats.recent is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    asyncio.run(poll_once_then_wait())
    assert stats.recent is None and not console.watching
