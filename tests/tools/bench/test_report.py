"""bench's files: perf_analyzer's CSV columns, JSON, the HTML page and the PNG chart."""

from __future__ import annotations

import csv
from pathlib import Path

from naiad.tools.bench.report import PA_COLUMNS, BenchResult, write_all
from naiad.tools.loadgen.measure import Measurement
from naiad.tools.loadgen.stats import ServerSplit

# perf_analyzer 2.51's `-f` header, as it writes it (docs/measurements_metrics.md upstream).
PERF_ANALYZER_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
                        "p50 latency,p90 latency,p95 latency,p99 latency")


def measurement(c: int, latency_us: int) -> Measurement:
    return Measurement("concurrency", c, 2, 1000, 0, 1.0, True, [latency_us * 1000] * 1000, [2000.0], 0.05,
                       ServerSplit(1000, 2000, 500, 300.0, 100.0, 10.0, 150.0, 5.0))


def test_files(tmp_path: Path) -> None:
    result = BenchResult("m", "http", "h:1", 2, [measurement(1, 500), measurement(8, 900)], started="now")
    written = write_all(result, tmp_path)
    assert [p.suffix for p in written] == [".csv", ".json", ".html", ".png"]
    header = (tmp_path / "m-http.csv").read_text().splitlines()[0]
    assert header.startswith(PERF_ANALYZER_HEADER + ",")
    assert header.split(",")[1:13] == PA_COLUMNS
    with (tmp_path / "m-http.csv").open() as f:
        row = next(csv.DictReader(f))
    assert row["Inferences/Second"] == "2000.0"  # 1000 requests/s of batch 2
    assert row["Server Queue"] == "100" and row["Network+Server Send/Recv"] == str(500 - 100 - 165)
    assert row["Avg batch"] == "4.0" and row["Client CPU us/request"] == "50.0"
    assert (tmp_path / "m-http.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "m-http.html").read_text()
