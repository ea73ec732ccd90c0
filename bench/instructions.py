"""Instructions per request, naiad beside Triton 2.51, process by process (issue 21).

CPU time per request moves with whatever else shares a virtual machine: on this project's 2-vCPU
VMs the same code's throughput moved x0.84-x1.40 between back-to-back rounds, too much to see a
5 % change. The instructions a process executes per request do not move with the load. Here each
server runs under `valgrind --tool=callgrind` (its children too: the model processes), serving
bench/python_backend.py's py_identity alone, and a tritonclient loop sends one FP32[1,16] request
at a time, over HTTP (binary tensor extension) and then gRPC: a warm-up, the counters zeroed
(`callgrind_control -z`), `--requests` requests, the counters dumped (`-d`). Each process's
instructions ÷ requests: the server, and the model process that executed them (the others idle).

valgrind counts user-space instructions only: system calls and the wake-ups between processes
(the kernel's share of a request) are not in these figures; CPU-µs (bench/python_backend.py,
bench/request_budget.py) has them. A run's figures repeat to within about 1 %, so a change to the
request path shows here from one run: `--baseline DIR` also measures naiad from another source
tree (DIR/src, e.g. `git archive <commit> src | tar -x -C DIR`) beside the working tree's.

    .venv/bin/python bench/instructions.py [--triton] [--baseline DIR] [--requests 500]

Needs valgrind (Debian's package) and, for `--triton`, `bash bench/setup_peers.sh`. Rewrites
bench/python_backend.py's repositories with py_identity alone (that benchmark writes its own
again each run). Results: a table and `.bench/results/instructions-<date>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    BENCH_DIR,
    RESULTS_DIR,
    ROOT,
    TRITON_BIN,
    TRITON_HOME,
    TRITON_LIBS,
    BenchError,
    Server,
    ensure_peers,
    env_with_libs,
    free_ports,
    start_server,
)
from python_backend import REPOS, model_files, write_repos

MODEL = "py_identity"
PROTOCOLS = ("http", "grpc")
DUMPS = BENCH_DIR / "callgrind"
WARMUP = 300  # requests before the counters are zeroed: every path taken and every cache filled


@dataclass
class Target:
    """One server to measure: naiad from a source tree, or Triton."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    # per protocol: {"server": instructions per request, "model": ..., "processes": {pid: ...}}
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)


def naiad_target(name: str, src: Path | None) -> Target:
    http, grpc, metrics = free_ports(3)
    argv = [str(ROOT / ".venv/bin/naiad"), "serve", f"--model-repository={REPOS['naiad']}",
            f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    env = dict(os.environ)
    if src is not None:  # ahead of the editable install on the path, for the server and its children
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    return Target(name, argv, env)


def triton_target() -> Target:
    http, grpc, metrics = free_ports(3)
    argv = [str(TRITON_BIN), f"--model-repository={REPOS['triton']}", f"--backend-directory={TRITON_HOME / 'backends'}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
            f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    return Target("triton", argv, env_with_libs(TRITON_LIBS))


def _client(proto: str, port: int) -> tuple[Any, list[Any], list[Any]]:
    """A tritonclient for `proto`, with py_identity's input and requested output."""
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    if proto == "http":
        import tritonclient.http as client_module

        client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = client_module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        return client, [tensor], [client_module.InferRequestedOutput("OUTPUT0", binary_data=True)]
    import tritonclient.grpc as client_module  # type: ignore[no-redef]

    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = client_module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    return client, [tensor], [client_module.InferRequestedOutput("OUTPUT0")]


def _traced(tag: str) -> list[int]:
    """The pids of this target's valgrind processes (the server and every child it started)."""
    out = subprocess.run(["pgrep", "-f", f"callgrind-out-file={DUMPS}/{tag}."], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


def _summary(path: Path) -> int:
    """A callgrind dump's total instructions (its `summary:` line)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise BenchError(f"no summary in {path}")


def _command(path: Path) -> str:
    for line in path.read_text(errors="replace").splitlines()[:20]:
        if line.startswith("cmd:"):
            return line[4:].strip()
    return ""


def measure(target: Target, requests: int) -> None:
    """Start `target` under callgrind, then each protocol: warm-up, zero, `requests` calls, dump."""
    tag = f"{target.name}-{os.getpid()}"
    argv = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={DUMPS}/{tag}.%p.out",
            *target.argv]
    server: Server = start_server(f"instructions-{target.name}", argv, target.env)
    try:
        server.wait_ready(900)  # everything runs some 20-50x slower under valgrind
        ports = {"http": server.http_port, "grpc": server.grpc_port}
        for part, proto in enumerate(PROTOCOLS, start=1):
            port = ports[proto]
            assert port is not None  # both servers are started with a gRPC port
            client, inputs, outputs = _client(proto, port)
            deadline = time.monotonic() + 600  # a model process may still be starting after /ready
            for done in range(WARMUP):
                try:
                    client.infer(MODEL, inputs, outputs=outputs)
                except Exception:
                    if done or time.monotonic() > deadline:
                        raise
                    time.sleep(2)
            pids = _traced(tag)
            for pid in pids:
                subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
            started = time.monotonic()
            for _ in range(requests):
                client.infer(MODEL, inputs, outputs=outputs)
            seconds = time.monotonic() - started
            for pid in pids:
                subprocess.run(["callgrind_control", "-d", proto, str(pid)], check=True, capture_output=True)
            client.close()
            per_process = {}
            for pid in pids:
                dump = DUMPS / f"{tag}.{pid}.out.{part}"
                for _ in range(100):  # the dump is written by the traced process itself
                    if dump.exists() and "summary:" in dump.read_text(errors="replace"):
                        break
                    time.sleep(0.1)
                per_process[pid] = {"command": _command(dump)[:200], "per_request": _summary(dump) / requests}
            server_pid = server.proc.pid  # valgrind runs the server in the process it was started as
            models = [v["per_request"] for pid, v in per_process.items() if pid != server_pid]
            target.figures[proto] = {
                "server": per_process[server_pid]["per_request"],
                "model": max(models, default=0.0),  # the one that executed; idle ones count ~0
                "processes": per_process, "requests": requests, "seconds": seconds,
            }
            print(f"  {target.name:<10} {proto:<5} server {target.figures[proto]['server'] / 1e3:7.1f}k  "
                  f"model process {target.figures[proto]['model'] / 1e3:6.1f}k instructions per request "
                  f"({requests} in {seconds:.1f} s)", flush=True)
    finally:
        server.stop()


def print_table(targets: list[Target]) -> None:
    names = [t.name for t in targets]
    pairs = [(a, b) for a, b in (("naiad", "baseline"), ("naiad", "triton"), ("baseline", "triton"))
             if a in names and b in names]
    print(f"\n## Instructions per request (thousands), {MODEL} FP32[1,16], c=1, user space only")
    print("| process | protocol | " + " | ".join(names) + " |" + "".join(f" {a} ÷ {b} |" for a, b in pairs))
    print("|---|---|" + "---:|" * (len(names) + len(pairs)))
    for process in ("server", "model", "both"):
        for proto in PROTOCOLS:
            values = {}
            for t in targets:
                figures = t.figures.get(proto)
                if figures is not None:
                    values[t.name] = figures["server"] + figures["model"] if process == "both" else figures[process]
            cells = [f"{values[n] / 1e3:,.1f}" if n in values else "-" for n in names]
            ratios = [f"{values[a] / values[b]:.3f}" if a in values and values.get(b) else "-" for a, b in pairs]
            print(f"| {process} | {proto} | " + " | ".join(cells) + " |" + "".join(f" {r} |" for r in ratios))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton", action="store_true", help="also Triton 2.51 on the same model.py")
    parser.add_argument("--baseline", type=Path, help="also naiad from DIR/src (another source tree)")
    parser.add_argument("--requests", type=int, default=500, help="measured requests per protocol")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("unavailable: valgrind is not installed (Debian's package `valgrind`)", flush=True)
        return 1
    if args.baseline is not None and not (args.baseline / "src" / "naiad").is_dir():
        raise SystemExit(f"--baseline {args.baseline}: no src/naiad there")
    if args.triton:
        ensure_peers()
    write_repos([model_files(argparse.Namespace(identity_instances=1))[MODEL]])
    DUMPS.mkdir(parents=True, exist_ok=True)
    for old in DUMPS.glob("*.out*"):
        old.unlink()
    targets = [naiad_target("naiad", None)]
    if args.baseline is not None:
        targets.append(naiad_target("baseline", args.baseline / "src"))
    if args.triton:
        targets.append(triton_target())
    started = datetime.now()
    for target in targets:
        print(f"{target.name}: starting under callgrind", flush=True)
        measure(target, args.requests)
    print_table(targets)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"instructions-{started.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"started": started.isoformat(), "model": MODEL, "args": vars(args) | {
        "baseline": str(args.baseline) if args.baseline else None}, "loadavg": os.getloadavg(),
        "targets": [asdict(t) for t in targets]}, indent=1, default=str))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
