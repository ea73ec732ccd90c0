"""`naiad bench`: run the sweep the flags (`naiad.tools.bench.flags`) describe and report it."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from naiad.tools.bench.progress import ProgressBar
from naiad.tools.bench.report import BenchResult, write_all, write_csv
from naiad.tools.loadgen.data import DataError, parse_shapes
from naiad.tools.loadgen.http1 import HttpError
from naiad.tools.loadgen.load import Recorder
from naiad.tools.loadgen.measure import MeasureError, Measurement, WindowSettings
from naiad.tools.loadgen.plan import DataSettings, RequestPlan, make_plan
from naiad.tools.loadgen.run import LoadLevel, RateSettings, run_level
from naiad.tools.loadgen.target import Target, TargetError, make_target

#: Builds the target for `naiad bench --in-process` (wired by naiad.cli: it needs the server's core).
InProcessFactory = Callable[[argparse.Namespace], Any]


def parse_range(text: str, integer: bool) -> list[float]:
    """perf_analyzer's `start:end:step` (additive step) or a comma list."""
    cast = int if integer else float
    try:
        if "," in text:
            values = [cast(v) for v in text.split(",") if v.strip()]
        else:
            parts = [cast(v) for v in text.split(":")]
            if len(parts) > 3:
                raise ValueError
            start = parts[0]
            end = parts[1] if len(parts) > 1 else start
            step = parts[2] if len(parts) > 2 else 1
            if step <= 0:
                raise ValueError
            values, value = [], start
            while value <= end + 1e-9:
                values.append(value)
                value += step
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START[:END[:STEP]] or a comma list, got '{text}'") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"levels must be positive, got '{text}'")
    return [float(v) for v in values]


def levels(args: argparse.Namespace) -> list[LoadLevel]:
    if args.request_rate_range and args.concurrency_range:
        raise argparse.ArgumentTypeError("give --concurrency-range or --request-rate-range, not both")
    if args.request_rate_range:
        return [LoadLevel("request_rate", v) for v in parse_range(args.request_rate_range, integer=False)]
    return [LoadLevel("concurrency", v) for v in parse_range(args.concurrency_range or "1", integer=True)]


def headers(values: list[str]) -> dict[str, str]:
    parsed = {}
    for value in values:
        name, sep, item = value.partition(":")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"-H expects NAME:VALUE, got '{value}'")
        parsed[name.strip()] = item.strip()
    return parsed


def window_settings(args: argparse.Namespace) -> WindowSettings:
    return WindowSettings(interval_s=args.measurement_interval / 1000.0, request_count=args.measurement_request_count,
                          stability_pct=args.stability_percentage, max_trials=max(1, args.max_trials),
                          stability_percentile=args.percentile)


def data_settings(args: argparse.Namespace) -> DataSettings:
    source = args.input_data
    return DataSettings(batch_size=args.batch_size, shapes=parse_shapes(args.shape),
                        input_file=None if source in ("random", "zero") else Path(source), zero=source == "zero",
                        string_length=args.string_length, shared_memory=args.shared_memory,
                        output_shm_size=args.output_shared_memory_size)


def summary(m: Measurement) -> str:
    """perf_analyzer-like lines for one level."""
    name = f"Concurrency {int(m.level)}" if m.mode == "concurrency" else f"Request rate {m.level:g}/s"
    stable = "stable" if m.stable else "NOT stable (raise --measurement-interval or --stability-percentage)"
    lines = [f"{name}: {m.throughput:,.1f} infer/s ({m.requests:,} requests in {m.duration_s:.1f} s, {stable})",
             f"  latency (µs): avg {m.avg_latency_us:,.0f}  p50 {m.latency_us(50):,.0f}  p90 {m.latency_us(90):,.0f}"
             f"  p95 {m.latency_us(95):,.0f}  p99 {m.latency_us(99):,.0f}"]
    if m.server is not None:
        s = m.server
        lines.append(f"  server (µs per request): queue {s.queue_us:,.0f} + compute input {s.compute_input_us:,.0f}"
                     f" + infer {s.compute_infer_us:,.0f} + output {s.compute_output_us:,.0f}"
                     f" = {s.server_us:,.0f} in server; avg batch {s.avg_batch:.2f}")
    extra = f"  client: {m.client_cpu_us_per_request:.1f} CPU-µs per request"
    if m.errors:
        extra += f"; {m.errors} errors (first: {m.first_error})"
    if m.delayed:
        extra += f"; {m.delayed} requests delayed (no free connection: raise --max-connections)"
    lines.append(extra)
    return "\n".join(lines)


async def sweep(plan: RequestPlan, load_levels: list[LoadLevel], settings: WindowSettings, rate: RateSettings,
                threshold_ms: float | None, bar: ProgressBar) -> list[Measurement]:
    """Measure each level in turn; stop past the latency threshold."""
    results = []
    for level in load_levels:
        recorder = Recorder()
        bar.start(str(level), recorder, settings)
        try:
            m = await run_level(plan, level, settings, bar.on_window, rate, recorder=recorder)
        finally:
            bar.stop()
        print(summary(m), flush=True)
        results.append(m)
        if threshold_ms is not None and m.latency_us(99) / 1000.0 > threshold_ms:
            print(f"p99 above --latency-threshold {threshold_ms:g} ms: stopping the sweep", flush=True)
            break
    return results


async def bench(args: argparse.Namespace, target: Target) -> BenchResult:
    plan = await make_plan(target, args.model, args.model_version, data_settings(args))
    result = BenchResult(args.model, target.protocol, args.url or "", args.batch_size,
                         started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                         settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                   if not callable(v)})
    rate = RateSettings(poisson=args.request_distribution == "poisson", max_slots=args.max_connections)
    try:
        result.measurements = await sweep(plan, levels(args), window_settings(args), rate, args.latency_threshold,
                                          ProgressBar(enabled=False if args.no_progress else None))
    finally:
        await plan.close()
    return result


async def _main(args: argparse.Namespace, in_process: InProcessFactory | None) -> int:
    if args.in_process:
        if in_process is None or not args.model_repository:
            print("error: --in-process needs --model-repository", file=sys.stderr)
            return 2
        target = await in_process(args)
    else:
        target = make_target(args.protocol, args.url or "localhost", headers(args.header),
                             args.grpc_streams_per_connection)
    try:
        if args.llm or await _is_llm(target, args):
            from naiad.tools.bench import llm_command

            return await llm_command.run(args, target)
        result = await bench(args, target)
    finally:
        await target.close()
    if args.latency_report_file is not None:
        write_csv(result, args.latency_report_file)
        print(f"wrote {args.latency_report_file}")
    if args.output_dir is not None:
        for path in write_all(result, args.output_dir):
            print(f"wrote {path}")
    return 0


async def _is_llm(target: Target, args: argparse.Namespace) -> bool:
    from naiad.tools.loadgen.spec import spec_from_config

    return spec_from_config(await target.model_config(args.model, args.model_version)).is_llm


def run(args: argparse.Namespace, in_process: InProcessFactory | None = None) -> int:
    """The `naiad bench` entry point: 0 when every level was measured, 1 on an error."""
    try:
        levels(args)
        headers(args.header)
    except argparse.ArgumentTypeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        runner: Callable[[Any], int] = asyncio.run
    else:
        runner = uvloop.run
    try:
        return runner(_main(args, in_process))
    except (TargetError, DataError, MeasureError, HttpError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
