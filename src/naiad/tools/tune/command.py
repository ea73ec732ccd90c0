"""`naiad tune MODEL_DIR`: start (or reach) a server, search, write the report."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from naiad.config.model_config import ModelConfig, read_model_config
from naiad.errors import NaiadError
from naiad.tools.loadgen.data import DataError, parse_shapes
from naiad.tools.loadgen.http1 import HttpError
from naiad.tools.loadgen.llm import LlmSettings
from naiad.tools.loadgen.plan import DataSettings
from naiad.tools.loadgen.spec import config_message
from naiad.tools.loadgen.target import TargetError, make_target
from naiad.tools.tune.report import write_report
from naiad.tools.tune.runner import Tuner, TuneResult, TuneSettings
from naiad.tools.tune.search import Objective
from naiad.tools.tune.server import ServeProcess, ServerStartError
from naiad.tools.tune.space import SpaceOptions, describe

LLM_METRICS = {"ttft": "ttft_ms", "itl": "itl_ms", "latency": "latency_ms"}


def settings_from_args(args: argparse.Namespace, llm: bool) -> TuneSettings:
    space = SpaceOptions(max_instances=args.max_instances, max_batch_sizes=args.max_batch_sizes,
                         queue_delays_us=args.queue_delays_us or SpaceOptions().queue_delays_us)
    source = args.input_data
    data = DataSettings(batch_size=args.batch_size, shapes=parse_shapes(args.shape),
                        input_file=None if source in ("random", "zero") else Path(source), zero=source == "zero")
    return TuneSettings(
        objective=Objective(args.p99_ms), time_budget_s=args.time_budget, interval_s=args.measurement_interval / 1000,
        min_requests=args.min_requests, max_concurrency=args.max_concurrency, confirm_rounds=args.confirm_rounds,
        confirm_interval_s=1.5 * args.measurement_interval / 1000, space=space, data=data,
        llm=LlmSettings(prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens) if llm else None,
        llm_metric=LLM_METRICS[args.llm_metric],
        llm_dimensions=tuple(d.strip() for d in args.llm_dimensions.split(",") if d.strip()),
    )


def _file_config(model_dir: Path) -> ModelConfig:
    config = read_model_config(model_dir)
    if config is None:
        config = ModelConfig()  # an auto-completed model: the tuned fields alone are written
    if not config.name:
        config.name = model_dir.name
    return config


async def _tune(args: argparse.Namespace, url: str, file_config: ModelConfig) -> TuneResult:
    target = make_target(args.protocol, url)
    try:
        served = config_message(await target.model_config(file_config.name))
        settings = settings_from_args(args, llm=served.backend in ("llm", "vllm"))
        print(f"tuning '{file_config.name}' on {url} ({args.protocol}): {settings.objective}, "
              f"time budget {settings.time_budget_s:.0f} s", flush=True)
        return await Tuner(target, file_config.name, settings).run()
    finally:
        await target.close()


def _summary(result: TuneResult) -> str:
    lines = [f"{len(result.trials)} configs measured in {result.search_s:.0f} s (whole run {result.elapsed_s:.0f} s)",
             f"start:  {describe(result.start)}", f"best:   {describe(result.best)}"]
    if result.confirmed.get("best"):
        lines.append(f"confirmed (median of {len(result.confirmed['best'])} rounds, same run): start "
                     f"{result.confirmed_throughput('start'):,.1f}/s, "
                     f"best {result.confirmed_throughput('best'):,.1f}/s")
    lines.append(f"chosen: {describe(result.chosen)}" + ("" if result.chosen != result.start else " (the start)"))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    model_dir: Path = args.model_dir.resolve()
    if not model_dir.is_dir():
        print(f"error: {model_dir} is not a model directory", file=sys.stderr)
        return 2
    try:
        file_config = _file_config(model_dir)
    except NaiadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    output = args.output_dir or Path(f"naiad-tune-{file_config.name}")
    server = None
    try:
        if args.url is None:
            server = ServeProcess(model_dir.parent, file_config.name, output / "naiad-serve.log", args.serve_arg)
            print(f"starting naiad serve for {model_dir.parent} (log: {server.log_path})", flush=True)
            server.wait_ready()
        url = args.url or server.url(args.protocol)  # type: ignore[union-attr]
        result = _runner()(_tune(args, url, file_config))
    except (TargetError, DataError, HttpError, ServerStartError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.stop()
    print(_summary(result))
    for path in write_report(result, file_config, output):
        print(f"wrote {path}")
    return 0


def _runner() -> Callable[[Any], Any]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run
    return uvloop.run
