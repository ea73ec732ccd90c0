"""What metrics and tracing cost: naiad's identity throughput with them off, then on.

    .venv/bin/python bench/observability.py [--concurrency 8 32] [--rounds 2] [--summaries]

"off" is `--allow-metrics=false` (tracing is off by default); "on" serves /metrics with its
default families, scraped every second by this script while perf_analyzer runs, and traces in
Triton's mode at its default rate (`--trace-config level=TIMESTAMPS`, one request in 1,000,
written to a file). `--summaries` also turns on the opt-in latency summaries and first-response
histogram (`--metrics-config`), which observe every request. The same identity
model and perf_analyzer HTTP load as bench/identity.py; off and on alternate in each round,
and the headline is on ÷ off throughput (issue 7 asks for less than 5 % apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request

from harness import BENCH_DIR, RESULTS_DIR, Server, ensure_peers, free_ports, start_server
from identity import NAIAD_BIN, NAIAD_REPO, PROTOCOLS, measure


def start(observed: bool, summaries: bool = False) -> tuple[Server, int]:
    http, grpc, metrics = free_ports(3)
    argv = [str(NAIAD_BIN), "serve", f"--model-repository={NAIAD_REPO}", f"--http-port={http}",
            f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1"]
    if observed:
        trace_file = BENCH_DIR / "logs/observability-trace.json"
        argv += ["--trace-config=level=TIMESTAMPS", f"--trace-config=triton,file={trace_file}"]
        if summaries:
            argv += ["--metrics-config=summary_latencies=true", "--metrics-config=histogram_latencies=true"]
    else:
        argv.append("--allow-metrics=false")
    return start_server("naiad-observed" if observed else "naiad-plain", argv), metrics


def scrape_every_second(port: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                answer.read()
        except OSError:
            pass  # not up yet, or going away


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--summaries", action="store_true", help="'on' observes every request in summaries too")
    args = parser.parse_args(argv)
    ensure_peers()
    plan = [(PROTOCOLS["http"], args.concurrency)]
    rates: dict[tuple[str, int], list[float]] = {}
    unavailable: dict[str, str] = {}
    for _ in range(args.rounds):
        for observed in (False, True):
            server, metrics_port = start(observed, args.summaries)
            stop = threading.Event()
            scraper = threading.Thread(target=scrape_every_second, args=(metrics_port, stop), daemon=True)
            if observed:
                scraper.start()
            try:
                for m in measure(server, plan, "INPUT0:16", unavailable):
                    rates.setdefault(("on" if observed else "off", m.concurrency), []).append(m.infer_per_s)
            finally:
                stop.set()
    print("\n| c | off infer/s | on infer/s | on ÷ off |\n|---:|---:|---:|---:|")
    rows = []
    for c in args.concurrency:
        off, on = (statistics.median(rates.get((k, c), [float("nan")])) for k in ("off", "on"))
        rows.append({"concurrency": c, "off": off, "on": on, "ratio": on / off})
        print(f"| {c} | {off:,.0f} | {on:,.0f} | {on / off:.3f} |")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"observability-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    path.write_text(json.dumps({"rows": rows, "all": {f"{k}-{c}": v for (k, c), v in rates.items()}}, indent=1))
    print(f"\nresults: {path}")
    return 1 if unavailable else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
