"""examples/grafana/naiad-dashboard.json asks only for metrics that naiad exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from naiad.backends.llm_metrics import LLMMetrics
from naiad.llm.engine.engine_core import EngineStats
from naiad.observability.metrics import CpuSampler, ModelSample, render_models
from naiad.observability.statistics import LatencySettings, ModelStatistics

DASHBOARD = Path(__file__).resolve().parents[2] / "examples/grafana/naiad-dashboard.json"


def _exported_families() -> set[str]:
    """Every family naiad can print: summaries and histogram on, an llm instance that has stepped."""
    stats = ModelStatistics("m", "1", latency=LatencySettings(summaries=True, histogram=True))
    stats.record_request(True, 1_000, 10, (1, 2, 3))
    stats.load_duration_s = 1.0
    llm = LLMMetrics("m_0")
    llm.engine = EngineStats(1, 2, 0, 0, 0)
    sample = ModelSample(stats, 0, tuple(llm.rows()))
    text = "\n".join([*render_models([sample]), *CpuSampler().render()]) + "\n"
    return {family.name for family in text_string_to_metric_families(text)}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queried = {name for expr in expressions for name in re.findall(r"\bnv_[a-z_]+", expr)}
    exported = _exported_families()
    # A histogram's or summary's series carry suffixes: `<family>_bucket`, `_sum`, `_count`.
    missing = {name for name in queried
               if name not in exported and re.sub(r"_(bucket|sum|count)$", "", name) not in exported}
    assert len(queried) >= 10
    assert not missing


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    text = DASHBOARD.read_text()
    for needed in ("nv_inference_count", "_summary_us", "nv_inference_pending_request_count",
                   "nv_llm_generation_tokens", "nv_llm_time_to_first_token_seconds", "nv_llm_prefix_cache_hit_rate"):
        assert needed in text
