"""`naiad tune` on the dynamic-batching benchmark's models, from their hand-tuned configs.

The MLP and the MiniLM encoder of bench/batching.py start from the configs docs/benchmarks.md
measured (MLP: max_batch_size 64, 200 µs queue delay, 2 instances; MiniLM: 32, 1000 µs,
preferred [4, 8], 2 instances). `naiad tune` runs on each (its own server, HTTP) under a p99
objective, and this prints, from its report (the same run, start and best measured alternately):

- the hand-tuned config's throughput at that p99 and the chosen config's, and their ratio
  (target >= 1: tune never makes it worse; it keeps the start when nothing beats it);
- the whole run's wall time, server start included (target < 300 s on 2 cores);
- the configs it measured, against the size of the grid it pruned.

Run by `make bench`; quote figures only from a quiet machine. Reports go to
.bench/results/tune-<model>-<date>/ (config.pbtxt, report.html, pareto.png, report.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from batching_models import Batching, BenchModel, write_minilm_data, write_naiad_repo
from harness import RESULTS_DIR, ROOT, fmt

NAIAD = ROOT / ".venv/bin/naiad"
MODELS = {
    "mlp": BenchModel("mlp", 64, Batching(200), 2),
    "minilm": BenchModel("minilm", 32, Batching(1000, (4, 8)), 2),
}
P99_MS = {"mlp": 10.0, "minilm": 1000.0}
LIMIT_S = 300.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--time-budget", type=float, default=270.0, help="naiad tune --time-budget (s)")
    args = parser.parse_args(argv)
    repo = write_naiad_repo([MODELS[m] for m in args.models])
    write_minilm_data()  # valid token ids (random int64s are outside the vocabulary and segment ids)
    stamp = time.strftime("%Y-%m-%dT%H%M%S")
    rows, failed = [], False
    for stem in args.models:
        model = MODELS[stem].name(dynamic=True)
        out = RESULTS_DIR / f"tune-{stem}-{stamp}"
        argv = [str(NAIAD), "tune", str(repo / model), "--p99-ms", str(P99_MS[stem]), "--time-budget",
                str(args.time_budget), "-o", str(out), *MODELS[stem].pa_args()]  # the data batching.py sends
        print(f"$ {' '.join(argv)}", flush=True)
        started = time.monotonic()
        done = subprocess.run(argv, text=True, timeout=900)
        wall = time.monotonic() - started
        if done.returncode != 0:
            print(f"tune of {model} failed with {done.returncode}", file=sys.stderr)
            failed = True
            continue
        report = json.loads((out / "report.json").read_text())
        start, best = report["start_confirmed_throughput"], report["best_confirmed_throughput"]
        if not report["confirmation"].get("best"):  # the search found nothing better: the start's own score
            start = best = report["trials"][0]["throughput"] if report["trials"][0]["feasible"] else 0.0
        elif report["chosen"] == report["start"]:
            best = start  # the confirmation kept the start
        grid = math.prod(len(v) for v in report["dimensions"].values())
        rows.append((stem, P99_MS[stem], start, best, wall, len(report["trials"]), grid, report["chosen"], out))
    print(f"\nnaiad tune from the hand-tuned configs (load average {os.getloadavg()[0]:.1f}); throughput at the p99 "
          "objective, start and chosen measured alternately in the same run")
    for stem, p99, start, best, wall, trials, grid, chosen, out in rows:
        ratio = best / start if start else None
        print(f"{stem}: p99 <= {p99:g} ms: hand-tuned {fmt(start, ',.1f')}/s, tuned {fmt(best, ',.1f')}/s, "
              f"ratio {fmt(ratio, '.2f')} (target >= 1); {wall:.0f} s wall (target < {LIMIT_S:.0f}); "
              f"{trials} of {grid} configs measured; chosen {chosen}; report {out / 'report.html'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
