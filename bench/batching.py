"""Dynamic-batching benchmark: naiad and real Triton 2.51 against onnxruntime's own ceiling.

Two models where the work is real, unlike the identity benchmark:

- the **MLP** (FP32 [-1, 256] -> MatMul 256x1024 -> ReLU -> MatMul 1024x256): about 1 MFLOP per
  row, so one request costs the server about as much as the model does, and forming batches
  (one onnxruntime call, one pass over the weights for many rows) is what lets a server keep up;
- the **MiniLM encoder** (sequence length 128): about 3 GFLOP per request, so serving costs are
  small next to the model and a server should reach nearly what onnxruntime reaches on its own.

What is measured, each model with dynamic batching on (``*_dynamic``) and off (``*_nobatch``):

- **ceiling**: onnxruntime in this process, the same file and session settings (1 intra-op
  thread per session, one session per server instance, run concurrently). Each round first
  sweeps batch sizes 1, 8, 32 and 64; the best is the most a server with that many instances
  could serve. That best batch size is then re-measured for a few seconds right before and
  right after every perf_analyzer run (while the server sits idle), and each run's throughput is
  divided by the mean of the two: this 2-core machine is shared, and how much CPU a
  compute-bound model gets moves with other jobs from one minute to the next;
- **naiad** (onnxruntime backend) and, for the MLP, **Triton** (Python backend, model.py running
  onnxruntime with the same thread settings and concatenating each batch Triton forms), both
  driven by perf_analyzer over HTTP (and gRPC) at each concurrency: infer/s and its ratio to the
  ceiling (and, for naiad's MLP, to Triton), p50/p99 latency (client side, µs), the server's
  CPU-µs per inference (its process tree's user+system time from /proc) and the average batch
  size the server formed (inference_count / execution_count from the statistics extension).

Run ``.venv/bin/python bench/batching.py`` (``--quick``: c=32 over HTTP only, a few minutes;
``--rounds 3`` for quotable medians). Results go to ``.bench/results/batching-<date>.json``,
logs to ``.bench/logs/batching-*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from batching_ceiling import CeilingRow, Feeds, Probe, best, measure_ceiling
from batching_models import (
    Batching,
    BenchModel,
    ensure_triton_onnxruntime,
    minilm_feeds,
    minilm_path,
    mlp_feeds,
    naiad_config,
    triton_config,
    write_minilm_data,
    write_naiad_repo,
    write_triton_repo,
)
from harness import (
    BENCH_DIR,
    RESULTS_DIR,
    ROOT,
    TRITON_BIN,
    TRITON_HOME,
    TRITON_LIBS,
    BenchError,
    Measurement,
    Server,
    UnavailableError,
    UnstableError,
    ensure_peers,
    env_with_libs,
    fmt,
    free_ports,
    http_get,
    median,
    run_perf_analyzer,
    start_server,
)

NAIAD_BIN = ROOT / ".venv/bin/naiad"
CEILING_BATCHES = [1, 8, 32, 64]
# MiniLM serves tens of requests/s: 3-second windows would hold too few of them to be stable.
WINDOW_MS = {"mlp": 3000, "minilm": 10000}
# Seconds of each ceiling probe taken between perf_analyzer runs (MiniLM: ~200 sequences).
PROBE_SECONDS = {"mlp": 1.0, "minilm": 3.0}


def bench_models(args: argparse.Namespace) -> dict[str, BenchModel]:
    """The two models with their dynamic-batching settings (defaults: see parse_args)."""
    return {
        "mlp": BenchModel("mlp", 64, Batching(args.mlp_delay_us, tuple(args.mlp_preferred)), args.instances),
        "minilm": BenchModel("minilm", args.minilm_max_batch,
                             Batching(args.minilm_delay_us, tuple(args.minilm_preferred)), args.instances),
    }


@dataclass
class Row:
    """One perf_analyzer run of one model variant on one server, with the batches it formed."""

    model: str  # "mlp" / "minilm"
    server: str  # "naiad" / "triton"
    dynamic: bool
    measurement: Measurement
    avg_batch: float | None  # inferences per execution over the run
    loadavg: float
    ceiling_before: float  # in-process rows/s at the round's best batch size, just before the run
    ceiling_after: float  # ... and just after it

    @property
    def ratio_to_ceiling(self) -> float:
        return 2 * self.measurement.infer_per_s / (self.ceiling_before + self.ceiling_after)


@dataclass
class Ceiling:
    model: str
    instances: int
    rows: list[CeilingRow]

    @property
    def best_rows_per_s(self) -> float:
        return best(self.rows).rows_per_s


# ---------------------------------------------------------------------------------------------
# servers


def start_naiad(repo: Path) -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [
        str(NAIAD_BIN), "serve", f"--model-repository={repo}",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
    ]
    return start_server("batching-naiad", argv)


def start_triton(repo: Path) -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [
        str(TRITON_BIN), f"--model-repository={repo}", f"--backend-directory={TRITON_HOME / 'backends'}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
    ]
    return start_server("batching-triton", argv, env_with_libs(TRITON_LIBS))


def execution_counts(server: Server, model: str) -> tuple[int, int] | None:
    """(inference_count, execution_count) from the statistics extension, None if unavailable."""
    status, body = http_get(f"http://{server.url}/v2/models/{model}/stats")
    if status != 200:
        return None
    try:
        stats = json.loads(body)["model_stats"]
        return sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats)
    except (ValueError, KeyError, TypeError):
        return None


def average_batch(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


# ---------------------------------------------------------------------------------------------
# measuring


def measure_row(server: Server, model: BenchModel, dynamic: bool, wire: str, c: int, probe: Probe,
                attempts: int = 3) -> Row | None:
    """One perf_analyzer run between two ceiling probes, retried while no window is stable (None
    if none ever is)."""
    name = model.name(dynamic)
    extra = [*model.pa_args(), "--measurement-interval", str(WINDOW_MS[model.stem])]
    for attempt in range(1, attempts + 1):
        load = os.getloadavg()[0]
        print(f"  {server.name} {name} {wire} c={c} (load {load:.2f}) ...", end="", flush=True)
        ceiling_before = probe.last if probe.last is not None else probe.measure()
        before = execution_counts(server, name)
        try:
            m = run_perf_analyzer(server, name, f"{name}-{wire}", wire, c, extra)
        except UnstableError:
            print(f" unstable (attempt {attempt}/{attempts})", flush=True)
            continue
        except subprocess.TimeoutExpired:  # perf_analyzer hung (seen once against Triton under load)
            print(f" perf_analyzer timed out (attempt {attempt}/{attempts})", flush=True)
            continue
        m.protocol = wire
        avg_batch = average_batch(before, execution_counts(server, name))
        row = Row(model.stem, server.name.removeprefix("batching-"), dynamic, m, avg_batch, load,
                  ceiling_before, probe.measure())
        print(f" {m.infer_per_s:,.0f} infer/s ({row.ratio_to_ceiling:.2f} of ceiling), batch {fmt(avg_batch, '.1f')}",
              flush=True)
        return row
    return None


def measure_server(server: Server, models: list[BenchModel], wires: list[str], concurrency: list[int],
                   probes: dict[str, Probe], unavailable: dict[str, str]) -> list[Row]:
    """Wait for ``server``, run every (model, batching, wire, c), always stop it."""
    rows: list[Row] = []
    try:
        server.wait_ready(timeout_s=180)
        for wire in wires:
            key = f"{server.name.removeprefix('batching-')}/{wire}"
            if key in unavailable:
                continue
            try:
                if wire == "grpc":
                    server.check_grpc()
                for model in models:
                    probe = probes[model.stem]
                    probe.last = None  # the previous "after" was taken next to another model's runs
                    for dynamic in (True, False):
                        rows += [r for c in concurrency if (r := measure_row(server, model, dynamic, wire, c, probe))]
            except UnavailableError as err:
                unavailable[key] = str(err)
                print(f"  {key}: unavailable: {err}", flush=True)
        return rows
    finally:
        server.stop()


def model_path(model: BenchModel) -> Path:
    return BENCH_DIR / "batching-models/mlp.onnx" if model.stem == "mlp" else minilm_path()


def model_feeds(model: BenchModel) -> Feeds:
    return mlp_feeds if model.stem == "mlp" else minilm_feeds


def measure_ceilings(models: list[BenchModel], seconds: float) -> list[Ceiling]:
    """onnxruntime in-process, one session per instance, at each of CEILING_BATCHES."""
    ceilings = []
    for model in models:
        print(f"  ceiling {model.stem} ({model.instances} sessions, load {os.getloadavg()[0]:.2f}) ...",
              end="", flush=True)
        rows = measure_ceiling(model_path(model), model_feeds(model), model.instances, CEILING_BATCHES, seconds)
        print(" " + ", ".join(f"b{r.batch} {r.rows_per_s:,.0f}" for r in rows) + " rows/s", flush=True)
        ceilings.append(Ceiling(model.stem, model.instances, rows))
    return ceilings


# ---------------------------------------------------------------------------------------------
# reporting


def ceiling_of(ceilings: list[Ceiling], model: str) -> float | None:
    return median([c.best_rows_per_s for c in ceilings if c.model == model])


def row_keys(rows: list[Row]) -> list[tuple[str, str, bool, str, int]]:
    """(model, server, dynamic, wire, c) in the order they were first measured."""
    keys = (
        (r.model, r.server, r.dynamic, r.measurement.protocol, r.measurement.concurrency) for r in rows
    )
    return list(dict.fromkeys(keys))


def summarise(rows: list[Row], ceilings: list[Ceiling]) -> list[dict[str, object]]:
    """One median line per (model, server, batching, wire, c), with ratios to ceiling and Triton."""
    lines = []
    for model, server, dynamic, wire, c in row_keys(rows):
        same = [r for r in rows if (r.model, r.server, r.dynamic, r.measurement.protocol,
                                    r.measurement.concurrency) == (model, server, dynamic, wire, c)]
        m = {f: median([getattr(r.measurement, f) for r in same])
             for f in ("infer_per_s", "p50_us", "p99_us", "cpu_us_per_infer")}
        peer = [r.measurement.infer_per_s for r in rows if (r.model, r.server, r.dynamic, r.measurement.protocol,
                                                             r.measurement.concurrency) == (model, "triton", dynamic,
                                                                                             wire, c)]
        sweep = ceiling_of(ceilings, model)
        lines.append({
            "model": model, "server": server, "batching": "on" if dynamic else "off", "protocol": wire,
            "concurrency": c, **m,
            "avg_batch": median([r.avg_batch for r in same]),
            "ratio_to_ceiling": median([r.ratio_to_ceiling for r in same]),
            "ceiling_adjacent": median([(r.ceiling_before + r.ceiling_after) / 2 for r in same]),
            "ratio_to_sweep_ceiling": m["infer_per_s"] / sweep if sweep and m["infer_per_s"] else None,
            "ratio_to_triton": (m["infer_per_s"] / statistics.median(peer)
                                if server == "naiad" and peer and m["infer_per_s"] else None),
            "rounds": len(same),
        })
    return lines


def print_table(lines: list[dict[str, object]], ceilings: list[Ceiling], rounds: int) -> None:
    print(f"\nin-process onnxruntime ceiling (median of {rounds} round(s), rows/s by batch size):")
    for model in dict.fromkeys(c.model for c in ceilings):
        per_batch = {b: median([r.rows_per_s for c in ceilings if c.model == model for r in c.rows if r.batch == b])
                     for b in CEILING_BATCHES}
        cells = ", ".join(f"b{b} {fmt(v)}" for b, v in per_batch.items())
        print(f"  {model}: {cells}; best {fmt(ceiling_of(ceilings, model))}")
    head = ["model", "server", "batch", "proto", "c", "infer/s", "ceiling", "/ceiling", "/Triton", "p50 us",
            "p99 us", "CPU-us/inf", "avg batch"]
    print(f"\nmedian of {rounds} round(s); ceiling = in-process rows/s measured around each run; "
          "latency from perf_analyzer; CPU-us = server CPU per inference")
    print("  ".join(f"{h:>10}" for h in head))
    for ln in lines:
        cells = [ln["model"], ln["server"], ln["batching"], ln["protocol"], str(ln["concurrency"]),
                 fmt(ln["infer_per_s"]), fmt(ln["ceiling_adjacent"]),
                 fmt(ln["ratio_to_ceiling"], ".2f"), fmt(ln["ratio_to_triton"], ".2f"),
                 fmt(ln["p50_us"]), fmt(ln["p99_us"]), fmt(ln["cpu_us_per_infer"]), fmt(ln["avg_batch"], ".1f")]
        print("  ".join(f"{cell:>10}" for cell in cells))


def write_json(rows: list[Row], ceilings: list[Ceiling], lines: list[dict[str, object]],
               models: list[BenchModel], unavailable: dict[str, str], args: argparse.Namespace,
               loads: list[tuple[float, float, float]]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"batching-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    doc = {
        "benchmark": "batching",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
        "cpus": os.cpu_count(),
        "loadavg_per_round": loads,
        "loadavg_end": os.getloadavg(),
        "client": "perf_analyzer 2.51.0 -i http|grpc --stability-percentage 100 --max-trials 3",
        "peer": "Triton 2.51.0 (nvidia-pytriton 0.7.0), Python backend model.py running onnxruntime",
        "naiad_configs": {m.name(d): naiad_config(m, d) for m in models for d in (True, False)},
        "triton_configs": {m.name(d): triton_config(m, d) for m in models if m.stem == "mlp" for d in (True, False)},
        "unavailable": unavailable,
        "summary": lines,
        "ceilings": [dataclasses.asdict(c) for c in ceilings],
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="ceiling-Triton-naiad rounds; medians are shown")
    parser.add_argument("--quick", action="store_true", help="c=32 over HTTP only (a few minutes)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--protocols", nargs="+", choices=["http", "grpc"], default=["http", "grpc"])
    parser.add_argument("--models", nargs="+", choices=["mlp", "minilm"], default=["mlp", "minilm"])
    parser.add_argument("--servers", nargs="+", choices=["naiad", "triton"], default=["triton", "naiad"])
    parser.add_argument("--instances", type=int, default=2, help="instances per model (and ceiling sessions)")
    parser.add_argument("--ceiling-seconds", type=float, default=2.0, help="per batch size and model")
    # MLP: ~10 µs of compute per row at batch 8+, so a short delay lets an idle instance gather
    # the requests that arrive while the other one computes without adding much to p50.
    parser.add_argument("--mlp-delay-us", type=int, default=200, help="max_queue_delay_microseconds")
    parser.add_argument("--mlp-preferred", type=int, nargs="*", default=[], help="preferred_batch_size")
    # MiniLM: tens of ms per sequence, so the delay is noise next to compute. onnxruntime computes
    # it no faster per row in batches of 8 than alone (and ~20 % slower at 32+), so preferred sizes
    # keep batches small: with 2 instances and closed-loop clients, one batch of 30 leaves the
    # other instance idle for a second while nearly every client waits on it.
    parser.add_argument("--minilm-delay-us", type=int, default=1000, help="max_queue_delay_microseconds")
    parser.add_argument("--minilm-preferred", type=int, nargs="*", default=[4, 8], help="preferred_batch_size")
    parser.add_argument("--minilm-max-batch", type=int, default=32, help="max_batch_size")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.protocols = [32], ["http"]
    return args


def prepare(models: list[BenchModel], servers: list[str]) -> tuple[Path, Path | None]:
    """Peers, repositories and input data; returns (naiad repo, Triton repo or None)."""
    triton_repo = None
    if "triton" in servers and any(m.stem == "mlp" for m in models):
        ensure_peers()
        ensure_triton_onnxruntime()
        triton_repo = write_triton_repo(next(m for m in models if m.stem == "mlp"))
    elif "naiad" in servers:
        ensure_peers()  # perf_analyzer
    if any(m.stem == "minilm" for m in models):
        write_minilm_data()
    return write_naiad_repo(models), triton_repo


def make_probes(models: list[BenchModel], ceilings: list[Ceiling], seconds: dict[str, float]) -> dict[str, Probe]:
    """One probe per model at the batch size that was best in this round's ceiling sweep."""
    probes = {}
    for model, ceiling in zip(models, ceilings, strict=True):
        probes[model.stem] = Probe(model_path(model), model_feeds(model), model.instances,
                                   best(ceiling.rows).batch, seconds[model.stem])
    return probes


def run_round(args: argparse.Namespace, models: list[BenchModel], repos: tuple[Path, Path | None],
              ceilings: list[Ceiling], rows: list[Row], unavailable: dict[str, str]) -> None:
    """The ceiling sweep, then each server in turn; appends to ``ceilings`` and ``rows`` as it goes."""
    swept = measure_ceilings(models, args.ceiling_seconds)
    ceilings += swept
    probes = make_probes(models, swept, PROBE_SECONDS)
    naiad_repo, triton_repo = repos
    for name in args.servers:
        if name == "triton" and triton_repo is not None:
            mlp = [m for m in models if m.stem == "mlp"]
            rows += measure_server(start_triton(triton_repo), mlp, args.protocols, args.concurrency, probes,
                                   unavailable)
        elif name == "naiad":
            rows += measure_server(start_naiad(naiad_repo), models, args.protocols, args.concurrency, probes,
                                   unavailable)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    catalog = bench_models(args)
    models = [catalog[name] for name in dict.fromkeys(args.models)]
    repos = prepare(models, args.servers)
    ceilings: list[Ceiling] = []
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    loads = []
    failure = None
    for round_no in range(1, args.rounds + 1):
        loads.append(os.getloadavg())
        print(f"round {round_no}/{args.rounds} (load {loads[-1][0]:.2f}):", flush=True)
        try:
            run_round(args, models, repos, ceilings, rows, unavailable)
        except (BenchError, OSError, subprocess.SubprocessError) as err:
            failure = str(err)
            print(f"\nfailed: {failure}", file=sys.stderr)
            break
    lines = summarise(rows, ceilings)
    print_table(lines, ceilings, len(loads))
    for key, reason in unavailable.items():
        print(f"unavailable: {key}: {reason}")
    print(f"\nresults: {write_json(rows, ceilings, lines, models, unavailable, args, loads)}")
    return 1 if failure or unavailable else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
