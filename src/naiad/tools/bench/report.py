"""bench's results as perf_analyzer writes them (CSV with its column names), as JSON, and as a
chart (SVG in an HTML page, and a PNG) of throughput against latency, one point per load level."""

from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.tools.chart import Chart, Point, Series, render_png, render_svg
from naiad.tools.loadgen.measure import Measurement

#: perf_analyzer's `-f` columns, in its order; the first is "Request Rate" in request-rate mode.
PA_COLUMNS = ["Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
              "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
              "p50 latency", "p90 latency", "p95 latency", "p99 latency"]
#: naiad's own, after perf_analyzer's (readers that go by column name ignore them).
EXTRA_COLUMNS = ["Avg latency", "Avg batch", "Errors", "Delayed", "Stable", "Client CPU us/request"]


@dataclass
class BenchResult:
    """One `naiad bench` run: its settings and a measurement per load level."""

    model: str
    protocol: str
    url: str
    batch_size: int
    measurements: list[Measurement] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    started: str = ""


def row(m: Measurement) -> dict[str, Any]:
    """One CSV row: latencies in µs, as perf_analyzer writes them (integers)."""
    server = m.server
    queue = server.queue_us if server else 0.0
    compute = (server.compute_input_us + server.compute_infer_us + server.compute_output_us) if server else 0.0
    avg = m.avg_latency_us
    first = "Concurrency" if m.mode == "concurrency" else "Request Rate"
    return {
        first: int(m.level) if m.mode == "concurrency" else round(m.level, 3),
        "Inferences/Second": round(m.throughput, 3),
        "Client Send": 0,  # bodies are encoded before the run: nothing to time on the client
        "Network+Server Send/Recv": round(max(0.0, avg - queue - compute)),
        "Server Queue": round(queue),
        "Server Compute Input": round(server.compute_input_us) if server else 0,
        "Server Compute Infer": round(server.compute_infer_us) if server else 0,
        "Server Compute Output": round(server.compute_output_us) if server else 0,
        "Client Recv": 0,
        "p50 latency": round(m.latency_us(50)),
        "p90 latency": round(m.latency_us(90)),
        "p95 latency": round(m.latency_us(95)),
        "p99 latency": round(m.latency_us(99)),
        "Avg latency": round(avg),
        "Avg batch": round(server.avg_batch, 2) if server else "",
        "Errors": m.errors,
        "Delayed": m.delayed,
        "Stable": int(m.stable),
        "Client CPU us/request": round(m.client_cpu_us_per_request, 1),
    }


def write_csv(result: BenchResult, path: Path) -> None:
    if not result.measurements:
        return
    first = "Concurrency" if result.measurements[0].mode == "concurrency" else "Request Rate"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, [first, *PA_COLUMNS, *EXTRA_COLUMNS])
        writer.writeheader()
        for m in result.measurements:
            writer.writerow(row(m))


def to_json(result: BenchResult) -> dict[str, Any]:
    levels = []
    for m in result.measurements:
        entry = row(m)
        entry.update({"mode": m.mode, "level": m.level, "requests": m.requests, "duration_s": round(m.duration_s, 3),
                      "window_throughputs": [round(t, 2) for t in m.window_throughputs],
                      "first_error": m.first_error})
        if m.server is not None:
            entry["server"] = {"requests": m.server.requests, "server_us": round(m.server.server_us, 1),
                               "executions": m.server.executions, "inferences": m.server.inferences}
        levels.append(entry)
    return {"model": result.model, "protocol": result.protocol, "url": result.url, "batch_size": result.batch_size,
            "started": result.started, "settings": result.settings, "results": levels}


def write_json(result: BenchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")


def chart(result: BenchResult) -> Chart:
    """Throughput against p50 and p99 latency (ms), a point per load level."""
    def label(m: Measurement) -> str:
        return f"c={int(m.level)}" if m.mode == "concurrency" else f"{m.level:g}/s"

    p50 = [Point(m.latency_us(50) / 1000, m.throughput, label(m)) for m in result.measurements]
    p99 = [Point(m.latency_us(99) / 1000, m.throughput, label(m)) for m in result.measurements]
    return Chart(f"{result.model} over {result.protocol}: throughput vs latency", "latency (ms)", "inferences / s",
                 [Series("p50 latency", p50), Series("p99 latency", p99, dashed=True)])


def write_html(result: BenchResult, path: Path) -> None:
    """A self-contained page: the chart inline as SVG, and the CSV's table."""
    rows = [row(m) for m in result.measurements]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in (rows[0] if rows else {}))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>naiad bench: {html.escape(result.model)}</title>
<style>body{{font-family:sans-serif;margin:24px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #d1d5db;padding:3px 8px;text-align:right}} th{{background:#f3f4f6}}</style></head>
<body><h1>naiad bench: {html.escape(result.model)}</h1>
<p>{html.escape(result.protocol)} at {html.escape(result.url)}, batch size {result.batch_size}, started
{html.escape(result.started)}. Latencies in µs, as perf_analyzer's CSV.</p>
{render_svg(chart(result))}
<table><tr>{head}</tr>{body}</table>
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)


def write_all(result: BenchResult, directory: Path) -> list[Path]:
    """CSV, JSON, HTML and (with Pillow) PNG under `directory`; the paths written."""
    stem = directory / f"{result.model}-{result.protocol}"
    written = [stem.with_suffix(".csv"), stem.with_suffix(".json"), stem.with_suffix(".html")]
    write_csv(result, written[0])
    write_json(result, written[1])
    write_html(result, written[2])
    if render_png(chart(result), stem.with_suffix(".png")):
        written.append(stem.with_suffix(".png"))
    return written
