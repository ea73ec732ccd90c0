"""The flags of `naiad tune MODEL_DIR`: find the config with the highest throughput under a p99
latency objective (or the highest throughput), changing the served config through the repository
API without restarting the server, and write the best config.pbtxt and a report with the Pareto
chart. Without --url it serves MODEL_DIR's repository itself (explicit model control)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'") from None


def _delays(text: str) -> tuple[object, ...]:
    values: list[object] = []
    for item in text.split(","):
        item = item.strip()
        if item == "off":
            values.append("off")
        elif item.isdigit():
            values.append(int(item))
        elif item:
            raise argparse.ArgumentTypeError(f"queue delays are microseconds or 'off', got '{item}'")
    return tuple(values)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="search a model's best config (instances, batching) under a latency objective",
                       description=__doc__)
    p.add_argument("model_dir", type=Path, help="the model's directory (config.pbtxt and versions)")
    p.add_argument("-u", "--url", default=None,
                   help="a running server in explicit model control that serves MODEL_DIR's repository "
                        "(default: start one)")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--p99-ms", type=float, default=None, help="latency objective; without it: highest throughput")
    p.add_argument("-o", "--output-dir", type=Path, default=None, help="default: ./naiad-tune-MODEL")
    p.add_argument("--time-budget", type=float, default=280.0, metavar="S",
                   help="seconds for the run: no new config is tried past 70%% of it, no confirmation round "
                        "after the first past all of it; a measurement under way finishes (default %(default)s)")
    p.add_argument("--measurement-interval", type=float, default=1000.0, metavar="MS",
                   help="window while searching (default %(default)s)")
    p.add_argument("--min-requests", type=int, default=30, help="a window also waits for this many answers")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--confirm-rounds", type=int, default=2, help="start-vs-best rounds at the end (0: none)")
    space = p.add_argument_group("search space")
    space.add_argument("--max-instances", type=int, default=min(8, 2 * (os.cpu_count() or 1)))
    space.add_argument("--max-batch-sizes", type=_ints, default=(), metavar="B1,B2,...",
                       help="default: powers of two up to max(64, the config's)")
    space.add_argument("--queue-delays-us", type=_delays, default=None, metavar="off,0,100,...",
                       help="max_queue_delay_microseconds values; 'off' = no dynamic batching")
    data = p.add_argument_group("data (as naiad bench)")
    data.add_argument("-b", "--batch-size", type=int, default=1)
    data.add_argument("--shape", action="append", default=[], metavar="NAME:d1,d2")
    data.add_argument("--input-data", default="random")
    llm = p.add_argument_group("LLM models (tokens/s under the objective)")
    llm.add_argument("--llm-metric", choices=["ttft", "itl", "latency"], default="ttft",
                     help="the per-request figure whose p99 --p99-ms bounds")
    llm.add_argument("--llm-dimensions", default="max_num_seqs,max_num_batched_tokens",
                     help="engine settings to search: max_num_seqs, max_num_batched_tokens, block_size, dtype, "
                          "quantization")
    llm.add_argument("--prompt-tokens", type=int, default=128)
    llm.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra flag for the naiad serve tune starts (repeatable)")
    return p
