"""Where one request's CPU goes: a ladder from a floor to naiad's Python backend (issue 21).

One FP32[16] identity request at a time (perf_analyzer, HTTP, concurrency 1, Triton's binary
tensor extension), each rung a server process that does a little more of what naiad does:

1. `floor`: httptools, and a hop to a child process over a Unix socket (the Python backend's
   process shape) that echoes the tensor back; as little Python as that can take;
2. `http`: the same with naiad's HTTP/1.1 protocol (`frontends/http/protocol.py`);
3. `codec`: plus naiad's KServe codec (decode the request, encode the response);
4. `naiad-identity`: naiad itself, the model on the in-process `identity` backend (its instance
   runs on a thread: no model process);
5. `naiad-python`: naiad itself, the model a `model.py` on the Python backend (the same file
   bench/python_backend.py serves);
6. `triton` (with `--triton`): Triton 2.51 serving that `model.py`, for reference.

For each rung: inferences/s, the server process tree's CPU-µs per inference (from /proc: server
and child together), and the step from the rung before. Rungs alternate within each round
(`--rounds`, medians shown), so a machine that speeds up or slows down mid-run moves every rung.
Rungs 1-3 are `bench/request_budget_server.py`. Needs `bash bench/setup_peers.sh` (perf_analyzer;
Triton for `--triton`). Rewrites bench/python_backend.py's repositories with py_identity alone
(that benchmark writes its own again each run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime

from harness import (
    BENCH_DIR,
    RESULTS_DIR,
    ROOT,
    BenchError,
    Measurement,
    Server,
    ensure_peers,
    fmt,
    free_ports,
    run_perf_analyzer,
    start_server,
)
from python_backend import model_files, start_naiad, start_triton, write_repos

MODEL = "py_identity"
SHAPE = ["--shape", "INPUT0:16"]
IDENTITY_REPO = BENCH_DIR / "request-budget-identity-repo"
NAIAD_BIN = ROOT / ".venv/bin/naiad"


def start_rung_server(mode: str) -> Server:
    (port,) = free_ports(1)
    argv = [sys.executable, str(ROOT / "bench/request_budget_server.py"), f"--mode={mode}", f"--http-port={port}"]
    return start_server(f"budget-{mode}", argv)


def start_naiad_identity() -> Server:
    """naiad with the model on the in-process identity backend (same config, other backend)."""
    config = (BENCH_DIR / "python-backend-naiad-repo" / MODEL / "config.pbtxt").read_text()
    (IDENTITY_REPO / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (IDENTITY_REPO / MODEL / "config.pbtxt").write_text(config.replace('backend: "python"', 'backend: "identity"'))
    http, grpc, metrics = free_ports(3)
    argv = [str(NAIAD_BIN), "serve", f"--model-repository={IDENTITY_REPO}", f"--http-port={http}",
            f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1"]
    return start_server("budget-naiad-identity", argv)


RUNGS: dict[str, Callable[[], Server]] = {
    "floor": lambda: start_rung_server("floor"),
    "http": lambda: start_rung_server("http"),
    "codec": lambda: start_rung_server("codec"),
    "naiad-identity": start_naiad_identity,
    "naiad-python": start_naiad,
    "triton": start_triton,
}


def measure(name: str) -> Measurement:
    server = RUNGS[name]()
    try:
        server.wait_ready(120)
        deadline = time.monotonic() + 60  # a model process may still be starting after /ready
        while True:
            try:
                run_perf_analyzer(server, MODEL, f"warmup-{name}", "http", 1, [*SHAPE])
                break
            except BenchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        return run_perf_analyzer(server, MODEL, f"budget-{name}", "http", 1, [*SHAPE])
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--triton", action="store_true", help="add Triton 2.51 on the same model.py")
    args = parser.parse_args(argv)
    ensure_peers()
    write_repos([model_files(argparse.Namespace(identity_instances=1))[MODEL]])
    rungs = [name for name in RUNGS if name != "triton" or args.triton]
    results: dict[str, list[Measurement]] = {name: [] for name in rungs}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}:", flush=True)
        for name in rungs:
            m = measure(name)
            results[name].append(m)
            print(f"  {name:15s} {m.infer_per_s:9,.0f} infer/s  {m.cpu_us_per_infer:5.0f} CPU-us/inf", flush=True)
    print(f"\nmedians of {args.rounds} round(s); c=1, HTTP, FP32[16]; CPU-us = server process tree per inference")
    print(f"{'rung':>15} {'infer/s':>10} {'CPU-us':>8} {'step':>8} {'p50 us':>8} {'p99 us':>8}")
    previous = None
    table = []
    for name in rungs:
        rows = results[name]
        cpu = statistics.median(m.cpu_us_per_infer for m in rows)
        row = {"rung": name, "infer_per_s": statistics.median(m.infer_per_s for m in rows), "cpu_us": cpu,
               "p50_us": statistics.median(m.p50_us for m in rows), "p99_us": statistics.median(m.p99_us for m in rows),
               "rounds": [m.__dict__ for m in rows]}
        step = None if previous is None or name == "triton" else cpu - previous
        print(f"{name:>15} {fmt(row['infer_per_s']):>10} {fmt(cpu):>8} {fmt(step, '+,.0f'):>8} "
              f"{fmt(row['p50_us']):>8} {fmt(row['p99_us']):>8}")
        table.append(row)
        if name != "triton":
            previous = cpu
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"request-budget-{datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps(table, indent=1, default=str))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
