"""Each CPU backend on the same MLP: naiad's throughput at concurrency 32 as a ratio to the
backend's own framework called in this process (issue 9).

    .venv/bin/python bench/framework_backends.py [--seconds 5] [--size 1024 4096 1024] [--backends ...] [--rounds 3]

The model is the conformance suite's MLP (tests/backends/conformance/mlp.py), resized to FP32
[batch, 1024] → 4096 → 1024 by default so that the framework's compute weighs against the
server's per-request work, served as `mlp_batched` (dynamic batching, max_batch_size 8) and driven by
perf_analyzer over HTTP with one row per request. The ceiling is the same model file run by its
framework in this process, with the threads its case's runner gives it (one for onnxruntime and
the C library; the framework's defaults for TensorFlow and OpenVINO), at batch 1 and at batch 8
(the most the batcher can form); the ratio is naiad's inferences/s over the better of the two,
in rows/s. A backend whose framework is not installed, or whose case has no in-process runner,
is listed as not measured.

Each backend's server starts once; each of ``--rounds`` rounds (default 1) measures the ceiling,
then naiad, and takes the ratio within the round. The table shows medians over the rounds, with
each round's ratio in brackets; every round's figures go to the JSON results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
from harness import (
    BENCH_DIR,
    RESULTS_DIR,
    ROOT,
    BenchError,
    ensure_peers,
    fmt,
    free_ports,
    median,
    run_perf_analyzer,
    start_server,
    with_rounds,
)

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]
from backends.conformance import mlp  # noqa: E402  (after the sys.path insert)
from backends.conformance.cases import BackendCase, all_cases, write_repository  # noqa: E402

MODEL = "mlp_batched"
CONCURRENCY = 32
FIELDS = ("infer_per_s", "p50_us", "cpu_us_per_infer", "ceiling_b1", "ceiling_b8")


def ceiling(case: BackendCase, version_dir: object, seconds: float) -> dict[int, float]:
    """Rows/s of the framework itself at batch 1 and 8, for `seconds` each."""
    assert case.in_process is not None
    run = case.in_process(version_dir)  # type: ignore[arg-type]
    rates = {}
    for batch in (1, 8):
        x = np.random.default_rng(batch).standard_normal((batch, mlp.IN)).astype(np.float32)
        reference = mlp.reference(x)  # the same model, to float32 rounding over `IN` and `HIDDEN` terms
        np.testing.assert_allclose(run(x), reference, rtol=1e-3, atol=1e-5 * float(np.abs(reference).max()) + 1e-4)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            run(x)
            calls += 1
        rates[batch] = calls * batch / (time.perf_counter() - start)
    return rates


def measure(case: BackendCase, seconds: float, rounds: int) -> dict[str, Any]:
    """Ceiling then naiad, ``rounds`` times on one server: medians, and every round's figures."""
    repo = BENCH_DIR / "backends" / case.name
    shutil.rmtree(repo, ignore_errors=True)
    write_repository(case, repo, only=frozenset({MODEL}))
    http, grpc, metrics = free_ports(3)
    server = start_server(f"naiad-{case.name}", [
        str(ROOT / ".venv/bin/naiad"), "serve", f"--model-repository={repo}", f"--http-port={http}",
        f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"])
    per_round = []
    try:
        server.wait_ready(120)
        shape = ["--shape", f"{case.input_name}:{mlp.IN}"]
        for round_no in range(1, rounds + 1):
            print(f"  {case.name} round {round_no}/{rounds} ...", flush=True)
            rates = ceiling(case, repo / MODEL / "1", seconds)
            served = run_perf_analyzer(server, MODEL, "http", "http", CONCURRENCY, shape)
            per_round.append({"infer_per_s": served.infer_per_s, "p50_us": served.p50_us,
                              "cpu_us_per_infer": served.cpu_us_per_infer, "ceiling_b1": rates[1],
                              "ceiling_b8": rates[8], "ratio": served.infer_per_s / max(rates.values())})
    finally:
        server.stop()
    return {"backend": case.name, **{f: median(r[f] for r in per_round) for f in FIELDS},
            "ratio": median(r["ratio"] for r in per_round), "ratios": [r["ratio"] for r in per_round],
            "rounds": per_round}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per in-process ceiling")
    parser.add_argument("--backends", nargs="*", help="case names (default: all)")
    parser.add_argument("--size", type=int, nargs=3, default=[1024, 4096, 1024], metavar=("IN", "HIDDEN", "OUT"))
    parser.add_argument("--rounds", type=int, default=1, help="ceiling-then-naiad rounds; medians are shown")
    args = parser.parse_args(argv)
    mlp.resize(*args.size)
    ensure_peers()
    rows, missing = [], {}
    for case in all_cases():
        if args.backends and case.name not in args.backends:
            continue
        if not case.available() or case.in_process is None:
            missing[case.name] = "framework not installed" if not case.available() else "no in-process runner"
            continue
        try:
            rows.append(measure(case, args.seconds, args.rounds))
        except BenchError as error:
            missing[case.name] = str(error).splitlines()[0]
    print(f"\nMLP {mlp.IN}->{mlp.HIDDEN}->{mlp.OUT}, naiad over HTTP at c={CONCURRENCY} (perf_analyzer) vs the "
          f"framework in-process, median of {args.rounds} round(s) (ratio over the better of batch 1 and 8 "
          "in the same round, each round's in brackets)")
    print(f"{'backend':<22}{'infer/s':>10}{'p50 ms':>9}{'CPU-us/inf':>12}{'ceil b1':>11}{'ceil b8':>11}  ratio")
    for row in rows:
        print(f"{row['backend']:<22}{fmt(row['infer_per_s']):>10}{fmt(row['p50_us'] / 1000, '.2f'):>9}"
              f"{fmt(row['cpu_us_per_infer']):>12}{fmt(row['ceiling_b1']):>11}{fmt(row['ceiling_b8']):>11}"
              f"  {with_rounds(row['ratios'])}")
    for name, why in missing.items():
        print(f"{name:<22}not measured: {why}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"backends-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"rounds": args.rounds, "rows": rows, "not_measured": missing}, indent=2))
    print(f"\nresults: {out}")
    return 0 if rows and not missing else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
