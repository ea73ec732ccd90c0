"""tune's report: the best config.pbtxt, a JSON of every trial, and an HTML page (and PNG) with
the Pareto chart — every measured point as p99 latency against throughput, the front no other
point beats on both, the starting config's points and the chosen config's."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from naiad.config.model_config import ModelConfig
from naiad.tools.chart import Chart, Point, Series, render_png, render_svg
from naiad.tools.tune.runner import TuneResult, write_best_config
from naiad.tools.tune.search import Score, pareto
from naiad.tools.tune.space import describe


def _score_json(score: Score) -> dict[str, Any]:
    return {"feasible": score.feasible, "throughput": round(score.throughput, 3), "concurrency": score.concurrency,
            "p99_ms": round(score.p99_ms, 3) if score.p99_ms != float("inf") else None, "error": score.error,
            "probes": [{"concurrency": p.concurrency, "throughput": round(p.throughput, 3),
                        "p99_ms": round(p.p99_ms, 3), "p50_ms": round(p.p50_ms, 3), "stable": p.stable}
                       for p in score.probes]}


def to_json(result: TuneResult) -> dict[str, Any]:
    return {
        "model": result.model, "objective": str(result.objective), "p99_ms": result.objective.p99_ms,
        "elapsed_s": round(result.elapsed_s, 1), "search_s": round(result.search_s, 1),
        "dimensions": {d.name: [str(v) for v in d.values] for d in result.dims},
        "start": dict(result.start), "best": dict(result.best), "chosen": dict(result.chosen),
        "start_confirmed_throughput": result.confirmed_throughput("start"),
        "best_confirmed_throughput": result.confirmed_throughput("best"),
        "confirmation": {k: [_score_json(s) for s in v] for k, v in result.confirmed.items()},
        "trials": [{"index": t.index, "config": {k: str(v) for k, v in t.candidate}, "in_place": t.in_place,
                    "seconds": round(t.seconds, 2), **_score_json(t.score)} for t in result.trials],
        "notes": result.notes,
    }


def _by_concurrency(score: Score) -> list[Point]:
    """One config's probes as a curve: in concurrency order (the search probes 1, 2, 4, ... then
    bisects back, and a line in that order would double back on itself)."""
    return [Point(p.p99_ms, p.throughput, f"c={p.concurrency}")
            for p in sorted(score.probes, key=lambda p: p.concurrency)]


def chart(result: TuneResult) -> Chart:
    everything = [(p.p99_ms, p.throughput, t) for t in result.trials for p in t.score.probes]
    front = pareto([(x, y, t) for x, y, t in everything])
    start_trial = next((t for t in result.trials if t.candidate == result.start), None)
    best_trial = next((t for t in result.trials if t.candidate == result.chosen), None)
    series = [Series("measured", [Point(x, y) for x, y, _ in everything], line=False, color="#9ca3af", size=3),
              Series("Pareto front", [Point(x, y) for x, y, _ in front], color="#111827", size=2)]
    if start_trial is not None:
        series.append(Series("start config", _by_concurrency(start_trial.score), color="#2563eb"))
    if best_trial is not None and best_trial is not start_trial:
        series.append(Series("chosen config", _by_concurrency(best_trial.score), color="#dc2626"))
    objective = result.objective.p99_ms
    return Chart(f"naiad tune {result.model}: throughput vs p99 latency", "p99 latency (ms)", "throughput / s",
                 series, (objective, f"p99 objective {objective:g} ms") if objective is not None else None)


def _trial_rows(result: TuneResult) -> str:
    rows = []
    for t in result.trials:
        s = t.score
        if s.error:
            outcome = f"refused: {html.escape(s.error[:200])}"
        elif s.feasible:
            outcome = f"{s.throughput:,.1f}/s at c={s.concurrency}, p99 {s.p99_ms:.2f} ms"
        else:
            outcome = f"objective not met (lowest p99 {s.p99_ms:.2f} ms)"
        mark = " (start)" if t.candidate == result.start else ""
        mark = " <b>(chosen)</b>" if t.candidate == result.chosen else mark
        rows.append(f"<tr><td>{t.index + 1}</td><td>{html.escape(describe(t.candidate))}{mark}</td>"
                    f"<td>{'in place' if t.in_place else 'reload'}</td><td>{t.seconds:.1f}</td><td>{outcome}</td></tr>")
    return "".join(rows)


def write_report(result: TuneResult, file_config: ModelConfig, directory: Path) -> list[Path]:
    """config.pbtxt, report.json, report.html and (with Pillow) pareto.png under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "config.pbtxt", directory / "report.json", directory / "report.html"]
    write_best_config(result, file_config, written[0])
    written[1].write_text(json.dumps(to_json(result), indent=2) + "\n")
    start_t, best_t = result.confirmed_throughput("start"), result.confirmed_throughput("best")
    verdict = (f"Confirmation (same run, alternating): start {start_t:,.1f}/s, best {best_t:,.1f}/s."
               if result.confirmed.get("best") else "The search found nothing better than the start.")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>naiad tune: {html.escape(result.model)}</title>
<style>body{{font-family:sans-serif;margin:24px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #d1d5db;padding:3px 8px}} th{{background:#f3f4f6}}</style></head>
<body><h1>naiad tune: {html.escape(result.model)}</h1>
<p>Objective: {html.escape(str(result.objective))}. {len(result.trials)} configs measured in {result.search_s:.0f} s
(whole run {result.elapsed_s:.0f} s). {html.escape(verdict)}</p>
<p>Chosen: <code>{html.escape(describe(result.chosen))}</code> (written to config.pbtxt).</p>
{render_svg(chart(result))}
<table><tr><th>#</th><th>config</th><th>applied</th><th>s</th><th>result</th></tr>{_trial_rows(result)}</table>
</body></html>
"""
    written[2].write_text(page)
    if render_png(chart(result), directory / "pareto.png"):
        written.append(directory / "pareto.png")
    return written
