"""tune's report: the Pareto chart's series, and the files it writes."""

from __future__ import annotations

import json
from pathlib import Path

from naiad.config.model_config import ModelConfig
from naiad.tools.tune.report import chart, write_report
from naiad.tools.tune.runner import TuneResult
from naiad.tools.tune.search import Objective, Probe, Score, Trial

START = (("instances", 1),)
BEST = (("instances", 2),)


def probes(*points: tuple[int, float, float]) -> tuple[Probe, ...]:
    return tuple(Probe(c, throughput, p99) for c, throughput, p99 in points)


def result() -> TuneResult:
    # The search probes 1, 2, 4, 8, 16 then bisects back to 12 and 10: out of concurrency order.
    start = Score(True, 300.0, 4, 8.0, probes((1, 100, 5), (2, 180, 6), (4, 300, 8), (8, 320, 14)))
    best = Score(True, 900.0, 10, 9.0, probes((1, 150, 4), (2, 300, 5), (4, 500, 6), (8, 800, 8), (16, 950, 15),
                                               (12, 920, 11), (10, 900, 9)))
    trials = [Trial(0, START, start, 3.0, True), Trial(1, BEST, best, 4.0, True)]
    return TuneResult("m", Objective(10.0), [], START, BEST, trials, {"start": [start], "best": [best]}, BEST,
                      ModelConfig(name="m"), 7.0, 7.0)


def test_each_configs_curve_runs_in_concurrency_order() -> None:
    series = {s.name: s for s in chart(result()).series}
    chosen = [p.label for p in series["chosen config"].points]
    assert chosen == ["c=1", "c=2", "c=4", "c=8", "c=10", "c=12", "c=16"]
    assert [p.label for p in series["start config"].points] == ["c=1", "c=2", "c=4", "c=8"]
    assert len(series["measured"].points) == 11  # every probe of every trial


def test_report_files(tmp_path: Path) -> None:
    written = write_report(result(), ModelConfig(name="m", max_batch_size=8), tmp_path)
    assert {p.name for p in written} >= {"config.pbtxt", "report.json", "report.html", "pareto.png"}
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["chosen"] == {"instances": 2} and report["best_confirmed_throughput"] == 900.0
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Pareto front" in (tmp_path / "report.html").read_text()
