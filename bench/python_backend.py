"""Python-backend benchmark: the same model.py files served by naiad and by real Triton 2.51.

naiad runs Triton's ``model.py`` API (``backend: "python"``). This benchmark serves the *same
bytes* on both servers: one generated repository per server under the git-ignored ``.bench/``
(``python-backend-naiad-repo/`` and ``python-backend-triton-repo/``), with byte-identical
``config.pbtxt`` and ``model.py`` (checked, and their SHA-256 recorded in the results), so any
difference is the server around the model: protocol handling, scheduling and batching, and the
hop from the server to the model's process (Triton: its C++ stub over shared memory; naiad: its
own model process per instance). Models:

- ``py_identity``: OUTPUT0 = INPUT0, FP32 [-1], ``max_batch_size: 8``, no dynamic batching, one
  CPU instance (``--identity-instances``); the ``model.py`` text of ``bench/identity.py``,
  16 floats per request. It does no work, so this measures the path through the Python backend.
- ``py_mlp``: the MLP of ``bench/batching_models.py`` (FP32 [-1, 256] -> 256x1024 -> ReLU ->
  1024x256) run by onnxruntime *inside* model.py (1 intra-op thread, one session per instance),
  with the dynamic batching and 2 instances of ``bench/batching.py``'s MLP defaults; each
  ``execute()`` concatenates the batch the server formed into one onnxruntime call.

Both ``model.py`` files call ``site.addsitedir`` on ``.bench/triton-venv``'s site-packages because
Triton's stub embeds Debian's libpython and ignores PYTHONPATH. On naiad the model process runs
naiad's own interpreter, whose site-packages come first on ``sys.path``, so the line only appends
a directory that is not used.

Each server starts once per round (Triton, then naiad) on free loopback ports, is polled on
``GET /v2/health/ready`` and then on each model's ``/ready``, and is driven by Triton's own load
generator, perf_analyzer, through ``harness.run_perf_analyzer`` exactly as the other benchmarks
drive it (three 3-second windows within 100 % of each other), for each model over ``http`` and
``grpc`` at concurrency 1, 8 and 32. For each row it prints throughput, the ratio naiad/Triton of
throughput, p50/p99 latency (client side, µs), the server's CPU-µs per inference (user+system
time of its whole process tree from /proc, i.e. including Triton's stubs and naiad's model
processes, divided by the inferences the server counted) and, from the statistics extension, the
average batch the server formed. A model or protocol a server cannot serve is reported as
unavailable with the server's error text, and the run exits 1 after printing what it measured.

Run ``.venv/bin/python bench/python_backend.py`` (``--quick``: c=32 over HTTP only;
``--rounds 3`` for quotable medians; ``make bench`` runs it last). Results go to
``.bench/results/python-backend-<date>.json``, logs to ``.bench/logs/python-*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from batching import average_batch, bench_models, execution_counts
from batching import parse_args as batching_defaults
from batching_models import MLP_IN, TRITON_MODEL_PY, build_mlp, ensure_triton_onnxruntime, triton_config
from google.protobuf import text_format
from harness import (
    BENCH_DIR,
    RESULTS_DIR,
    ROOT,
    TRITON_BIN,
    TRITON_HOME,
    TRITON_LIBS,
    TRITON_SITE,
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
    tail,
)
from identity import DEFAULT_CONFIG as IDENTITY_CONFIG
from identity import MODEL_PY as IDENTITY_MODEL_PY
from tritonclient.grpc import model_config_pb2

NAIAD_BIN = ROOT / ".venv/bin/naiad"
REPOS = {"naiad": BENCH_DIR / "python-backend-naiad-repo", "triton": BENCH_DIR / "python-backend-triton-repo"}
MLP_ONNX = BENCH_DIR / "batching-models/mlp.onnx"
MODELS = ("py_identity", "py_mlp")
PA_SHAPES = {"py_identity": ["--shape", "INPUT0:16"], "py_mlp": ["--shape", f"INPUT:{MLP_IN}"]}


# ---------------------------------------------------------------------------------------------
# repositories


@dataclass(frozen=True)
class ModelFiles:
    """What one model directory holds, identical on both servers."""

    name: str
    config: str
    model_py: str
    onnx: Path | None = None  # copied to 1/model.onnx (py_mlp's model.py loads it)


def renamed(config_text: str, name: str, instances: int | None = None) -> str:
    """``config_text`` with ``name`` (Triton requires it to match the directory), optionally
    ``instances`` CPU instances, re-serialised by protobuf so both servers read the same text."""
    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    config.name, config.backend = name, "python"
    config.ClearField("platform")
    if instances is not None:
        config.ClearField("instance_group")
        config.instance_group.add(count=instances, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return text_format.MessageToString(config)


def model_files(args: argparse.Namespace) -> dict[str, ModelFiles]:
    """The two models: identity.py's model.py and config; batching's MLP model.py, batching, instances."""
    mlp = bench_models(batching_defaults([]))["mlp"]
    site_dir = str(TRITON_SITE)
    return {
        "py_identity": ModelFiles(
            "py_identity",
            renamed(IDENTITY_CONFIG, "py_identity", args.identity_instances),
            IDENTITY_MODEL_PY.format(site_dir=site_dir),
        ),
        "py_mlp": ModelFiles(
            "py_mlp",
            renamed(triton_config(mlp, dynamic=True), "py_mlp"),
            TRITON_MODEL_PY.format(site_dir=site_dir),
            MLP_ONNX,
        ),
    }


def write_repo(root: Path, models: list[ModelFiles]) -> Path:
    """Generate one server's repository (only this run's models) and return its root."""
    if root.exists():
        shutil.rmtree(root)
    for model in models:
        version_dir = root / model.name / "1"
        version_dir.mkdir(parents=True)
        (root / model.name / "config.pbtxt").write_text(model.config)
        (version_dir / "model.py").write_text(model.model_py)
        if model.onnx is not None:
            shutil.copyfile(model.onnx, version_dir / "model.onnx")
    return root


def repo_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file of a repository, keyed by its path inside it."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*")) if path.is_file()
    }


def write_repos(models: list[ModelFiles]) -> dict[str, str]:
    """Both repositories; raises unless they are byte-identical. Returns the files' digests."""
    if any(m.onnx is not None for m in models):
        build_mlp(MLP_ONNX)
    digests = {name: repo_digests(write_repo(root, models)) for name, root in REPOS.items()}
    if digests["naiad"] != digests["triton"]:
        raise BenchError(f"the two repositories differ: {digests}")
    return digests["naiad"]


# ---------------------------------------------------------------------------------------------
# servers


def start_triton() -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [
        str(TRITON_BIN), f"--model-repository={REPOS['triton']}", f"--backend-directory={TRITON_HOME / 'backends'}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
    ]
    return start_server("python-triton", argv, env_with_libs(TRITON_LIBS))


def start_naiad() -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [
        str(NAIAD_BIN), "serve", f"--model-repository={REPOS['naiad']}",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
    ]
    return start_server("python-naiad", argv)


SERVERS = {"triton": start_triton, "naiad": start_naiad}


def short_name(server: Server) -> str:
    return server.name.removeprefix("python-")


def check_model(server: Server, model: str) -> dict[str, object] | None:
    """Raise UnavailableError unless ``model`` is ready; return the config the server serves."""
    status, body = http_get(f"http://{server.url}/v2/models/{model}/ready")
    if status != 200:
        _, index = http_get(f"http://{server.url}/v2/repository/index")  # holds the load error, if any
        raise UnavailableError(
            f"{model} not ready (HTTP {status} {body.decode(errors='replace').strip()}); "
            f"repository index: {index.decode(errors='replace').strip()}; log tail:\n{tail(server.log, 20)}"
        )
    status, body = http_get(f"http://{server.url}/v2/models/{model}/config")
    try:
        return json.loads(body) if status == 200 else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# measuring


@dataclass
class Row:
    """One perf_analyzer run of one model on one server, with the batches the server formed."""

    model: str
    server: str  # "naiad" / "triton"
    measurement: Measurement  # .protocol is the wire: "http" / "grpc"
    avg_batch: float | None  # inferences per execution over the run (statistics extension)
    loadavg: float


def measure_row(server: Server, model: str, wire: str, c: int, attempts: int = 3) -> Row | None:
    """One concurrency, retried while perf_analyzer finds no stable window (None if it never does)."""
    for attempt in range(1, attempts + 1):
        load = os.getloadavg()[0]
        print(f"  {short_name(server)} {model} {wire} c={c} (load {load:.2f}) ...", end="", flush=True)
        before = execution_counts(server, model)
        try:
            m = run_perf_analyzer(server, model, f"{model}-{wire}", wire, c, PA_SHAPES[model])
        except UnstableError:
            print(f" unstable (attempt {attempt}/{attempts})", flush=True)
            continue
        except subprocess.TimeoutExpired:
            print(f" perf_analyzer timed out (attempt {attempt}/{attempts})", flush=True)
            continue
        except UnavailableError:
            print(" failed", flush=True)
            raise
        m.protocol = wire
        batch = average_batch(before, execution_counts(server, model))
        print(f" {m.infer_per_s:,.0f} infer/s, {m.cpu_us_per_infer:,.0f} CPU-us/inf, batch {fmt(batch, '.1f')}",
              flush=True)
        return Row(model, short_name(server), m, batch, load)
    return None


def measure_server(server: Server, models: list[str], wires: list[str], concurrency: list[int],
                   unavailable: dict[str, str], served: dict[str, object]) -> list[Row]:
    """Wait for ``server``, run every (model, wire, c) it can serve, always stop it.

    A model or wire the server cannot serve goes to ``unavailable`` (``server/model`` or
    ``server/model/wire``) with the reason, and is skipped from then on, also in later rounds.
    """
    rows: list[Row] = []
    name = short_name(server)
    try:
        server.wait_ready(timeout_s=180)
        for model in models:
            if f"{name}/{model}" in unavailable:
                continue
            try:
                served[f"{name}/{model}"] = check_model(server, model)
            except UnavailableError as err:
                unavailable[f"{name}/{model}"] = str(err)
                print(f"  {name}/{model}: unavailable: {err}", flush=True)
                continue
            for wire in wires:
                key = f"{name}/{model}/{wire}"
                if key in unavailable:
                    continue
                try:
                    if wire == "grpc":
                        server.check_grpc()
                    rows += [r for c in concurrency if (r := measure_row(server, model, wire, c))]
                except UnavailableError as err:
                    unavailable[key] = str(err)
                    print(f"  {key}: unavailable: {err}", flush=True)
        return rows
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# reporting


@dataclass
class Side:
    """One server's medians over the rounds of one (model, wire, c); None where nothing was measured."""

    infer_per_s: float | None
    p50_us: float | None
    p99_us: float | None
    cpu_us_per_infer: float | None
    avg_batch: float | None
    rounds: int  # rounds that gave a stable measurement


@dataclass
class Line:
    """One (model, wire, c) of the summary: both servers and the ratio naiad/Triton of infer/s."""

    model: str
    protocol: str
    concurrency: int
    naiad: Side
    triton: Side
    ratio: float | None


def side(rows: list[Row]) -> Side:
    return Side(
        infer_per_s=median([r.measurement.infer_per_s for r in rows]),
        p50_us=median([r.measurement.p50_us for r in rows]),
        p99_us=median([r.measurement.p99_us for r in rows]),
        cpu_us_per_infer=median([r.measurement.cpu_us_per_infer for r in rows]),
        avg_batch=median([r.avg_batch for r in rows]),
        rounds=len(rows),
    )


def summarise(rows: list[Row], models: list[str], wires: list[str], concurrency: list[int]) -> list[Line]:
    """One line per (model, wire, c) that either server measured, medians over rounds."""
    lines = []
    for model in models:
        for wire in wires:
            for c in concurrency:
                key = (model, wire, c)
                same = [r for r in rows if (r.model, r.measurement.protocol, r.measurement.concurrency) == key]
                naiad = side([r for r in same if r.server == "naiad"])
                triton = side([r for r in same if r.server == "triton"])
                if not naiad.rounds and not triton.rounds:
                    continue
                ratio = naiad.infer_per_s / triton.infer_per_s if naiad.infer_per_s and triton.infer_per_s else None
                lines.append(Line(model, wire, c, naiad, triton, ratio))
    return lines


def print_table(lines: list[Line], rounds: int, servers: list[str], unavailable: dict[str, str]) -> None:
    titles = {"infer_per_s": "inf/s", "p50_us": "p50", "p99_us": "p99", "cpu_us_per_infer": "CPU-us",
              "avg_batch": "batch"}
    head = ["model", "proto", "c", "ratio"] + [f"{s} {t}" for t in titles.values() for s in ("naiad", "Triton")]
    print(f"\nmedian of {rounds} round(s); ratio = naiad/Triton infer/s; latency in us (perf_analyzer); "
          "CPU-us = server CPU per inference; batch = inferences per model execution")
    print("  ".join(f"{h:>13}" for h in head))
    for ln in lines:
        cells = [ln.model, ln.protocol, str(ln.concurrency), fmt(ln.ratio, ".2f")]
        for f in titles:
            spec = ".1f" if f == "avg_batch" else ",.0f"
            cells += [fmt(getattr(s, f), spec) for s in (ln.naiad, ln.triton)]
        print("  ".join(f"{cell:>13}" for cell in cells))
    for ln in lines:
        for name, s in (("naiad", ln.naiad), ("triton", ln.triton)):
            skipped = {f"{name}/{ln.model}", f"{name}/{ln.model}/{ln.protocol}"} & unavailable.keys()
            if name in servers and s.rounds < rounds and not skipped:
                print(f"note: {name} {ln.model} {ln.protocol} c={ln.concurrency}: "
                      f"{s.rounds}/{rounds} round(s) gave a stable measurement")


def write_json(rows: list[Row], lines: list[Line], files: dict[str, ModelFiles],
               digests: dict[str, str], served: dict[str, object], unavailable: dict[str, str],
               failures: list[str], args: argparse.Namespace, loads: list[tuple[float, float, float]]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"python-backend-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    doc = {
        "benchmark": "python-backend",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
        "cpus": os.cpu_count(),
        "loadavg_per_round": loads,
        "loadavg_end": os.getloadavg(),
        "client": "perf_analyzer 2.51.0 -i http|grpc --measurement-interval 3000 --stability-percentage 100 "
                  "--max-trials 3",
        "peer": "Triton 2.51.0 (nvidia-pytriton 0.7.0), Python backend",
        "models": args.models,
        "protocols": args.protocols,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "configs": {name: f.config for name, f in files.items() if name in args.models},
        "repo_sha256": digests,
        "served_configs": served,
        "unavailable": unavailable,
        "failures": failures,
        "summary": [dataclasses.asdict(ln) for ln in lines],
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--protocols", nargs="+", choices=["http", "grpc"], default=["http", "grpc"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=1, help="Triton-then-naiad rounds; medians are shown")
    parser.add_argument("--quick", action="store_true", help="c=32 over HTTP only")
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=list(SERVERS))
    parser.add_argument("--identity-instances", type=int, default=1, help="py_identity CPU instances")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.protocols = [32], ["http"]
    args.models = list(dict.fromkeys(args.models))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    ensure_peers()
    if "py_mlp" in args.models and "triton" in args.servers:
        ensure_triton_onnxruntime()
    files = model_files(args)
    digests = write_repos([files[m] for m in args.models])
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    served: dict[str, object] = {}
    failures: list[str] = []
    loads = []
    for round_no in range(1, args.rounds + 1):
        loads.append(os.getloadavg())
        print(f"round {round_no}/{args.rounds} (load {loads[-1][0]:.2f}):", flush=True)
        for name in args.servers:
            try:
                rows += measure_server(SERVERS[name](), args.models, args.protocols, args.concurrency,
                                       unavailable, served)
            except (BenchError, OSError) as err:
                failures.append(f"{name} failed: {err}")
                print(f"\n{failures[-1]}", file=sys.stderr)
        if failures:
            break
    lines = summarise(rows, args.models, args.protocols, args.concurrency)
    print_table(lines, len(loads), args.servers, unavailable)
    for key, reason in unavailable.items():
        print(f"unavailable: {key}: {reason}")
    for failure in failures:
        print(f"failed: {failure}")
    print(f"\nresults: {write_json(rows, lines, files, digests, served, unavailable, failures, args, loads)}")
    return 1 if failures or unavailable else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
