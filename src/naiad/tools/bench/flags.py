"""The flags of `naiad bench MODEL`: perf_analyzer's measurements (and genai-perf's for LLMs) from one CLI.

Flags follow perf_analyzer's names where it has one (`-u`, `-i`, `-b`, `--concurrency-range`,
`--request-rate-range`, `--measurement-interval`, `--stability-percentage`, `--max-trials`,
`--shape`, `--input-data`, `--shared-memory`, `-f`), so a perf_analyzer command line mostly
runs unchanged.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure a model's throughput and latency (perf_analyzer / genai-perf)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="model name")
    p.add_argument("-u", "--url", default=None, help="server host:port (default localhost:8000 http, :8001 grpc)")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("-x", "--model-version", default="", help="version to query (default: the server's choice)")
    p.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE",
                   help="HTTP header / gRPC metadata on every request (e.g. 'Authorization: Bearer T')")
    p.add_argument("--in-process", action="store_true",
                   help="serve --model-repository in this process and call it without a network")
    p.add_argument("--model-repository", action="append", default=[], help="with --in-process")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency-range", default=None, metavar="START[:END[:STEP]] | C1,C2,...",
                      help="closed-loop concurrencies (default 1)")
    load.add_argument("--request-rate-range", default=None, metavar="START[:END[:STEP]] | R1,R2,...",
                      help="open-loop request rates per second instead of concurrencies")
    load.add_argument("--request-distribution", choices=["poisson", "constant"], default="poisson")
    load.add_argument("--max-connections", type=int, default=256, help="request-rate mode: most connections")
    load.add_argument("--grpc-streams-per-connection", type=int, default=0,
                      help="gRPC: calls multiplexed on each HTTP/2 connection (default 0: up to 100 on one, "
                           "as perf_analyzer shares one channel)")
    load.add_argument("-l", "--latency-threshold", type=float, default=None, metavar="MS",
                      help="stop the sweep after a level whose p99 latency is above this")
    window = p.add_argument_group("measurement (as perf_analyzer)")
    window.add_argument("-p", "--measurement-interval", type=float, default=5000.0, metavar="MS")
    window.add_argument("--measurement-request-count", type=int, default=0, metavar="N",
                        help="count windows: each window also waits for N answers")
    window.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    window.add_argument("-r", "--max-trials", type=int, default=10)
    window.add_argument("--percentile", type=float, default=None,
                        help="stabilize on this latency percentile instead of the average")
    data = p.add_argument_group("data")
    data.add_argument("-b", "--batch-size", type=int, default=1)
    data.add_argument("--shape", action="append", default=[], metavar="NAME:d1,d2", help="dims of dynamic inputs")
    data.add_argument("--input-data", default="random",
                      help="random, zero, or a JSON (perf_analyzer's) / .npy / .npz file")
    data.add_argument("--string-length", type=int, default=128, help="length of random BYTES elements")
    data.add_argument("--shared-memory", choices=["none", "system"], default="none")
    data.add_argument("--output-shared-memory-size", type=int, default=100 * 1024, metavar="BYTES")
    out = p.add_argument_group("output")
    out.add_argument("-f", "--latency-report-file", type=Path, default=None, help="CSV in perf_analyzer's columns")
    out.add_argument("--output-dir", type=Path, default=None, help="write CSV, JSON, HTML and PNG here")
    out.add_argument("--no-progress", action="store_true", help="no live progress line")
    _llm_flags(p)
    return p



def _llm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM models (genai-perf's figures over the OpenAI API)")
    g.add_argument("--llm", action="store_true", help="measure as an LLM even if the backend is not 'llm'")
    g.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    g.add_argument("--prompt-tokens", type=int, default=128, help="synthetic prompt length (tokens)")
    g.add_argument("--prompt-tokens-stddev", type=int, default=0)
    g.add_argument("--output-tokens", type=int, default=128, help="tokens to generate (ignore_eos)")
    g.add_argument("--request-count", type=int, default=0,
                   help="requests measured per concurrency (default: 4 x concurrency, at least 8)")
    g.add_argument("--warmup-request-count", type=int, default=0)
