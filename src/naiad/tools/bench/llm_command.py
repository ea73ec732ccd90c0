"""`naiad bench MODEL` for LLMs: genai-perf's figures over the OpenAI API.

Chosen when the model's backend is an LLM one (or with `--llm`): for each concurrency (number
of streams) it sends `--request-count` streamed completions of synthetic prompts of
`--prompt-tokens` tokens asking for `--output-tokens` tokens, and prints time to first token,
inter-token latency, request latency, sequence lengths, output tokens/s and requests/s.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

from naiad.tools.chart import Chart, Point, Series, render_png, render_svg
from naiad.tools.loadgen.llm import LlmMeasurement, LlmSettings, PromptMaker, measure_llm
from naiad.tools.loadgen.target import HttpTarget, Target, TargetError

#: genai-perf's rows: (label, per-request attribute).
STAT_ROWS = [("Time To First Token (ms)", "ttft_ms"), ("Inter Token Latency (ms)", "itl_ms"),
             ("Request Latency (ms)", "latency_ms"), ("Output Sequence Length (tokens)", "output_tokens"),
             ("Input Sequence Length (tokens)", "prompt_tokens")]
STAT_COLUMNS = ["avg", "min", "max", "p99", "p90", "p75"]


def lines(m: LlmMeasurement) -> str:
    out = [f"Streams {m.concurrency}: {m.output_token_throughput:,.1f} output tokens/s, "
           f"{m.request_throughput:.2f} requests/s ({len(m.records)} requests in {m.duration_s:.1f} s)"]
    for label, attr in STAT_ROWS:
        s = m.stat(attr)
        out.append(f"  {label:<34} avg {s['avg']:9.2f}  p50 {s['p50']:9.2f}  p90 {s['p90']:9.2f}  "
                   f"p99 {s['p99']:9.2f}")
    return "\n".join(out)


def write_csv(m: LlmMeasurement, path: Path) -> None:
    """genai-perf's profile_export CSV: a statistics table, then Metric,Value rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Metric", *STAT_COLUMNS])
        for label, attr in STAT_ROWS:
            s = m.stat(attr)
            writer.writerow([label, *(f"{s[c]:.2f}" for c in STAT_COLUMNS)])
        writer.writerow([])
        writer.writerow(["Metric", "Value"])
        writer.writerow(["Output Token Throughput (tokens/sec)", f"{m.output_token_throughput:.2f}"])
        writer.writerow(["Request Throughput (per sec)", f"{m.request_throughput:.2f}"])


def to_json(model: str, results: list[LlmMeasurement], settings: LlmSettings) -> dict[str, Any]:
    return {"model": model, "settings": dataclasses.asdict(settings),
            "results": [{"concurrency": m.concurrency, "output_token_throughput": m.output_token_throughput,
                     "request_throughput": m.request_throughput, "requests": len(m.records),
                     **{attr: m.stat(attr) for _, attr in STAT_ROWS}} for m in results]}


def chart(model: str, results: list[LlmMeasurement]) -> Chart:
    ttft = [Point(m.stat("ttft_ms")["p99"], m.output_token_throughput, f"{m.concurrency}") for m in results]
    itl = [Point(m.stat("itl_ms")["p99"], m.output_token_throughput, f"{m.concurrency}") for m in results]
    return Chart(f"{model}: output tokens/s vs p99 latency (label: streams)", "p99 latency (ms)", "output tokens / s",
                 [Series("TTFT p99", ttft), Series("ITL p99", itl, dashed=True)])


def write_all(model: str, results: list[LlmMeasurement], settings: LlmSettings, directory: Path) -> list[Path]:
    written = []
    for m in results:
        path = directory / f"{model}-llm-c{m.concurrency}.csv"
        write_csv(m, path)
        written.append(path)
    path = directory / f"{model}-llm.json"
    path.write_text(json.dumps(to_json(model, results, settings), indent=2) + "\n")
    written.append(path)
    page = directory / f"{model}-llm.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>naiad bench {model}</title></head>"
                    f"<body style='font-family:sans-serif'><h1>naiad bench: {model}</h1>"
                    f"{render_svg(chart(model, results))}<pre>{chr(10).join(lines(m) for m in results)}</pre>"
                    "</body></html>\n")
    written.append(page)
    if render_png(chart(model, results), directory / f"{model}-llm.png"):
        written.append(directory / f"{model}-llm.png")
    return written


async def run(args: argparse.Namespace, target: Target) -> int:
    if not isinstance(target, HttpTarget):
        raise TargetError("LLM models are measured over the OpenAI API: use -i http and the HTTP port")
    from naiad.tools.bench.command import parse_range

    settings = LlmSettings(endpoint=args.endpoint, prompt_tokens=args.prompt_tokens,
                           prompt_tokens_stddev=args.prompt_tokens_stddev, output_tokens=args.output_tokens)
    prompts = PromptMaker(settings)
    await prompts.calibrate(target.control, args.model)
    results = []
    for level in parse_range(args.concurrency_range or "1", integer=True):
        streams = int(level)
        count = args.request_count or max(8, 4 * streams)
        m = await measure_llm(target.host, target.port, args.model, prompts, streams, count,
                              args.warmup_request_count)
        print(lines(m), flush=True)
        results.append(m)
    if args.output_dir is not None:
        for path in write_all(args.model, results, settings, args.output_dir):
            print(f"wrote {path}")
    elif args.latency_report_file is not None and results:
        write_csv(results[-1], args.latency_report_file)
        print(f"wrote {args.latency_report_file}")
    return 0
