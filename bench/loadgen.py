"""`naiad bench` against perf_analyzer: same server, same model, same settings, same run.

Starts naiad as `make serve` does (the example repository, explicit model control) serving
`identity`, then for each protocol and concurrency runs perf_analyzer and `naiad bench` one after
the other (the order alternates between concurrencies, so drift on a shared machine hurts neither
side more), both with `--measurement-interval T --stability-percentage 100 --max-trials 10` and
the same `--shape`. It prints, per row:

- the throughput each tool reports and their ratio naiad bench / perf_analyzer (target 0.9-1.1);
- each client's own CPU per request: its process's user+system time (getrusage of the child)
  divided by the requests the server counted during the run. A whole run includes start-up
  (Python's imports cost naiad bench ~0.3-0.5 CPU-s; perf_analyzer's start is cheaper), so each
  tool also runs a second time at twice the interval at the last concurrency, and the *marginal*
  cost, (CPU_long - CPU_short) / (requests_long - requests_short), is what the target
  (naiad bench <= perf_analyzer at c=32) is checked on.

On a machine this small the client's own CPU decides what the server can serve: perf_analyzer
spends 3-6x more CPU per request than naiad bench, CPU the server then lacks, so unpinned the two
tools measure two different servers. By default (`--pin`, with 2 or more CPUs) the server runs on
CPU 0 and each tool on the others (`taskset`), as a load generator on its own machine would: both
then drive the same server, and the ratio says whether naiad bench measures what perf_analyzer
measures. `--no-pin` shares all CPUs as before.

The server starts once; `--rounds N` (default 1) repeats all of the above N times on it. The
table shows medians over the rounds, each ratio taken within its round and each round's ratio in
brackets; the marginal costs are medians of each round's.

Run by `make bench`; `--quick` (0.5 s windows) only checks that everything works. Quote figures
only from a quiet machine. Results, every round's runs included, go to
.bench/results/loadgen-<date>.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from harness import (
    LOG_DIR,
    PA_BIN,
    PA_LIBS,
    RESULTS_DIR,
    ROOT,
    BenchError,
    Server,
    ensure_peers,
    env_with_libs,
    fmt,
    free_ports,
    median,
    model_inference_count,
    start_server,
    with_rounds,
)

MODEL = "identity"
NAIAD = ROOT / ".venv/bin/naiad"
FIELDS = (("infer_per_s", ",.0f"), ("p50_us", ",.0f"), ("cpu_us_per_request", ".1f"))  # table: field, format


@dataclass
class Run:
    """One tool's run at one concurrency."""

    tool: str  # "perf_analyzer" or "naiad bench"
    protocol: str
    concurrency: int
    interval_ms: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    cpu_s: float  # the tool's user+system CPU for the whole run
    requests: int  # counted by the server over the whole run
    wall_s: float
    round: int = 1

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s * 1e6 / self.requests if self.requests else 0.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_split(pin: bool) -> tuple[list[str], list[str]]:
    """`taskset` prefixes for the server and for the tools: CPU 0 and the rest, or none."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return [], []
    return ["taskset", "-c", str(cpus[0])], ["taskset", "-c", ",".join(map(str, cpus[1:]))]


def run_tool(tool: str, url: str, http_url: str, protocol: str, concurrency: int, interval_ms: int,
             shape: str, prefix: list[str]) -> Run:
    """Run one tool to completion; raise BenchError with its output when it fails."""
    out_csv = LOG_DIR / f"loadgen-{tool.replace(' ', '_')}-{protocol}-c{concurrency}-{interval_ms}.csv"
    out_csv.unlink(missing_ok=True)
    common = ["--concurrency-range", str(concurrency), "--measurement-interval", str(interval_ms),
              "--stability-percentage", "100", "--max-trials", "10", "--shape", shape, "-f", str(out_csv)]
    if tool == "perf_analyzer":
        argv, env = [str(PA_BIN), "-m", MODEL, "-u", url, "-i", protocol, *common], env_with_libs(PA_LIBS)
    else:
        argv, env = [str(NAIAD), "bench", MODEL, "-u", url, "-i", protocol, "--no-progress", *common], None
    count0, cpu0, t0 = model_inference_count(http_url, MODEL), children_cpu(), time.monotonic()
    done = subprocess.run(prefix + argv, capture_output=True, text=True, env=env, timeout=600)
    cpu1, t1, count1 = children_cpu(), time.monotonic(), model_inference_count(http_url, MODEL)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    (out_csv.with_suffix(".log")).write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not out_csv.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise BenchError(f"{tool} exited with {done.returncode}: " + " | ".join(tail))
    with out_csv.open(newline="") as f:
        row = next(csv.DictReader(f))
    requests = (count1 or 0) - (count0 or 0)
    return Run(tool, protocol, concurrency, interval_ms, float(row["Inferences/Second"]), float(row["p50 latency"]),
               float(row["p99 latency"]), cpu1 - cpu0, requests, t1 - t0)


def marginal(short: Run, long: Run) -> float | None:
    """CPU-µs per extra request between a short and a long run (start-up cancels out)."""
    extra = long.requests - short.requests
    return (long.cpu_s - short.cpu_s) * 1e6 / extra if extra > 0 else None


def one_round(server: Server, args: argparse.Namespace, interval: int, tool_cpus: list[str],
              round_no: int) -> tuple[list[Run], dict[str, dict[str, float | None]]]:
    """Both tools at each protocol and concurrency, then the long runs: the round's runs and marginals."""
    runs: list[Run] = []
    marginals: dict[str, dict[str, float | None]] = {}
    for protocol in args.protocols:
        url = server.url_for(protocol)
        if protocol == "grpc":
            server.check_grpc()
        for index, c in enumerate(args.concurrency):
            tools = ["perf_analyzer", "naiad bench"]
            for tool in tools if index % 2 == 0 else reversed(tools):
                runs.append(run_tool(tool, url, server.url, protocol, c, interval, args.shape, tool_cpus))
        last = args.concurrency[-1]
        marginals[protocol] = {}
        for tool in ("perf_analyzer", "naiad bench"):
            long = run_tool(tool, url, server.url, protocol, last, 2 * interval, args.shape, tool_cpus)
            short = next(r for r in runs if r.tool == tool and r.protocol == protocol and r.concurrency == last)
            runs.append(long)
            marginals[protocol][tool] = marginal(short, long)
    for run in runs:
        run.round = round_no
    return runs, marginals


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", nargs="+", choices=["http", "grpc"], default=["http", "grpc"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--interval-ms", type=int, default=3000, help="measurement interval of both tools")
    parser.add_argument("--shape", default="INPUT0:16")
    parser.add_argument("--quick", action="store_true", help="0.5 s windows: checks the script, quotes nothing")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="server on CPU 0, the tools on the others (default on)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds on the same server; medians are shown")
    args = parser.parse_args(argv)
    server_cpus, tool_cpus = cpu_split(args.pin)
    interval = 500 if args.quick else args.interval_ms
    ensure_peers()
    http_port, grpc_port, metrics_port = free_ports(3)
    server = start_server("loadgen-naiad", [
        *server_cpus, str(NAIAD), "serve", "--model-repository", str(ROOT / "examples/models"),
        "--model-control-mode", "explicit",
        f"--load-model={MODEL}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}"])
    runs: list[Run] = []
    marginals: list[dict[str, dict[str, float | None]]] = []  # one per round
    failed = False
    try:
        server.wait_ready(timeout_s=120)
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}/{args.rounds} ...", flush=True)
            round_runs, round_marginals = one_round(server, args, interval, tool_cpus, round_no)
            runs += round_runs
            marginals.append(round_marginals)
    except BenchError as error:
        print(f"loadgen: {error}", file=sys.stderr)
        failed = True  # print the rounds that completed
    finally:
        server.stop()
    if not marginals:
        return 1
    print_table(runs, marginals, args, interval, server_cpus, tool_cpus)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"loadgen-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    path.write_text(json.dumps({"benchmark": "loadgen", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "loadavg": os.getloadavg(), "cpus": os.cpu_count(), "quick": args.quick,
                                "interval_ms": interval, "rounds": len(marginals),
                                "server_cpus": server_cpus[2:], "tool_cpus": tool_cpus[2:],
                                "runs": [asdict(r) for r in runs],
                                "marginal_cpu_us_per_request": marginals}, indent=2) + "\n")
    print(f"\nresults: {path}")
    return 1 if failed else 0


def print_table(runs: list[Run], marginals: list[dict[str, dict[str, float | None]]], args: argparse.Namespace,
                interval: int, server_cpus: list[str], tool_cpus: list[str]) -> None:
    pinned = f"server on CPU {server_cpus[-1]}, tools on {tool_cpus[-1]}" if server_cpus else "CPUs shared"
    print(f"\nidentity on naiad ({interval} ms windows, {pinned}), median of {len(marginals)} round(s); infer/s as "
          "each tool reports it; ratio = naiad bench / perf_analyzer within each round (each round's in brackets); "
          "CPU-us = the client's own CPU per request over its whole run")
    head = ["protocol", "c", "PA inf/s", "bench inf/s", "PA p50", "bench p50", "PA CPU-us", "bench CPU-us"]
    print("  ".join(f"{h:>12}" for h in head) + "  ratio")
    for protocol in args.protocols:
        for c in args.concurrency:
            pairs = []  # (perf_analyzer, naiad bench) of each round that ran both
            for round_no in range(1, len(marginals) + 1):
                same = {r.tool: r for r in runs if (r.protocol, r.concurrency, r.interval_ms, r.round)
                        == (protocol, c, interval, round_no)}
                if "perf_analyzer" in same and "naiad bench" in same:
                    pairs.append((same["perf_analyzer"], same["naiad bench"]))
            if not pairs:
                continue
            ratios = [nb.infer_per_s / pa.infer_per_s if pa.infer_per_s else None for pa, nb in pairs]
            sides = ([pa for pa, _ in pairs], [nb for _, nb in pairs])
            cells = [protocol, str(c)] + [fmt(median(getattr(r, field) for r in side), spec)
                                          for field, spec in FIELDS for side in sides]
            print("  ".join(f"{cell:>12}" for cell in cells) + f"  {with_rounds(ratios)}")
    last = args.concurrency[-1]
    for protocol in dict.fromkeys(p for m in marginals for p in m):
        pa, nb = (median(m.get(protocol, {}).get(tool) for m in marginals) for tool in ("perf_analyzer", "naiad bench"))
        verdict = "met" if pa is not None and nb is not None and nb <= pa else "NOT met"
        print(f"{protocol} c={last}: marginal client CPU-us per request: perf_analyzer {fmt(pa, '.1f')}, "
              f"naiad bench {fmt(nb, '.1f')} (target naiad bench <= perf_analyzer: {verdict})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
