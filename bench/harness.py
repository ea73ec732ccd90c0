"""Shared pieces of naiad's side-by-side benchmarks: peer paths, server processes, perf_analyzer.

Every benchmark starts a server on free loopback ports, waits for ``GET /v2/health/ready`` to
answer 200 (and gRPC ``ServerReady`` when it is to be driven over gRPC), drives it with Triton's
own load generator (perf_analyzer) over HTTP or gRPC and reads the CPU time the server's whole
process tree spent from ``/proc``. Nothing here knows which server it runs.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
RESULTS_DIR = BENCH_DIR / "results"
LOG_DIR = BENCH_DIR / "logs"
TRITON_SITE = BENCH_DIR / "triton-venv/lib/python3.11/site-packages"
TRITON_HOME = TRITON_SITE / "pytriton/tritonserver"
TRITON_BIN = TRITON_HOME / "bin/tritonserver"
TRITON_LIBS = TRITON_SITE / "nvidia_pytriton.libs"
PA_BIN = BENCH_DIR / "pa-venv/bin/perf_analyzer"
PA_LIBS = BENCH_DIR / "pa-venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Three 3-second windows; perf_analyzer keeps the last one when all are within 100 % of each other.
PA_STABILITY = ["--measurement-interval", "3000", "--stability-percentage", "100", "--max-trials", "3"]


class BenchError(RuntimeError):
    """A benchmark step failed; the message says which and how to look further."""


class UnstableError(BenchError):
    """perf_analyzer's windows disagreed by more than the stability bound (a noisy machine)."""


class UnavailableError(BenchError):
    """The server cannot be driven this way (e.g. no gRPC listener, shared memory refused)."""


def ensure_peers() -> None:
    """Run ``bench/setup_peers.sh`` when tritonserver or perf_analyzer is missing."""
    if TRITON_BIN.exists() and PA_BIN.exists():
        return
    print("peers not installed: running bench/setup_peers.sh", flush=True)
    subprocess.run(["bash", str(ROOT / "bench/setup_peers.sh")], check=True)


def free_ports(count: int) -> list[int]:
    """Ask the kernel for ``count`` distinct free loopback ports."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def env_with_libs(libs: Path) -> dict[str, str]:
    """The current environment with ``libs`` prepended to LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libs}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(libs)
    return env


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (empty when it is missing)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``; returns (status, body), with status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


@dataclass
class Server:
    """A server process started by a benchmark, in its own session so it can be stopped whole."""

    name: str
    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int | None
    log: Path
    grpc_error: str | None = None  # None until probed, then "" (ready) or why not

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def url_for(self, wire: str) -> str:
        """The ``-u`` for perf_analyzer ``-i wire`` (``http`` or ``grpc``)."""
        return self.url if wire == "http" else f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/v2/health/ready`` until it answers 200; raise with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise BenchError(f"{self.name} exited with {code} before ready ({self.log}):\n{tail(self.log)}")
            if http_get(f"http://{self.url}/v2/health/ready")[0] == 200:
                return
            time.sleep(0.25)
        raise BenchError(f"{self.name} not ready after {timeout_s:.0f} s ({self.log}):\n{tail(self.log)}")

    def check_grpc(self, timeout_s: float = 10.0) -> None:
        """Raise UnavailableError unless gRPC ``ServerReady`` answers true (probed once per server)."""
        if self.grpc_error is None:
            self.grpc_error = self._probe_grpc(timeout_s)
        if self.grpc_error:
            raise UnavailableError(self.grpc_error)

    def _probe_grpc(self, timeout_s: float) -> str:
        """"" once ``ServerReady`` answers true within ``timeout_s``, else why not."""
        import tritonclient.grpc as grpcclient  # only needed by gRPC benchmarks

        deadline, last = time.monotonic() + timeout_s, "no answer"
        while time.monotonic() < deadline:
            try:
                with grpcclient.InferenceServerClient(self.url_for("grpc")) as client:
                    if client.is_server_ready(client_timeout=2.0):
                        return ""
                    last = "ServerReady answered false"
            except Exception as err:  # any client error means not usable; keep the last message
                last = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            time.sleep(0.5)
        return f"gRPC on {self.url_for('grpc')} not ready after {timeout_s:.0f} s: {last}"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the server's process group, then SIGKILL it if it lingers."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_server(name: str, argv: list[str], env: dict[str, str] | None = None) -> Server:
    """Start ``argv`` (its ``--http-port=`` and ``--grpc-port=`` are read back), logging to .bench/logs/NAME.log."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    flags = dict(a.split("=", 1) for a in argv if a.startswith(("--http-port=", "--grpc-port=")))
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    grpc = int(flags["--grpc-port"]) if "--grpc-port" in flags else None
    return Server(name, proc, int(flags["--http-port"]), grpc, log)


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime+cutime+cstime in ticks) of one process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU seconds (user + system) used so far by ``root_pid`` and every live descendant.

    /proc/PID/stat sums all threads of a process; the tree walk adds children such as
    Triton's Python-backend stub or naiad's model workers.
    """
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _proc_stat(int(p)))}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total / CLK_TCK


def model_inference_count(url: str, model: str) -> int | None:
    """The server's own inference count for ``model`` (statistics extension), if it has one."""
    status, body = http_get(f"http://{url}/v2/models/{model}/stats")
    if status != 200:
        return None
    try:
        stats = json.loads(body)["model_stats"]
        return sum(int(s["inference_count"]) for s in stats)
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class Measurement:
    """One perf_analyzer run at one concurrency, with the server's CPU cost per inference."""

    protocol: str  # e.g. "http", "grpc", "http-shm"
    concurrency: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    cpu_us_per_infer: float
    inferences: int
    count_source: str  # "server-stats" or "throughput*wall"
    server_cpu_s: float
    wall_s: float


def parse_pa_csv(path: Path) -> dict[str, float]:
    """The single result row of a perf_analyzer ``-f`` CSV, keyed by column name."""
    with path.open(newline="") as f:
        row = next(csv.DictReader(f))
    return {k: float(v) for k, v in row.items() if k and v not in (None, "")}


def pa_error(output: str) -> str:
    """The line of perf_analyzer's output that says why it gave up (its last non-empty line otherwise)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or ["no output"])[-1][:300]


def run_perf_analyzer(
    server: Server, model: str, protocol: str, wire: str, concurrency: int, extra: list[str]
) -> Measurement:
    """Drive ``server`` with perf_analyzer ``-i wire`` at one concurrency and cost it in server CPU.

    ``protocol`` names the row (e.g. ``grpc-shm``); ``extra`` carries its perf_analyzer flags.
    Raises UnstableError when no window was stable, UnavailableError when perf_analyzer failed.
    """
    stem = f"{server.name}-{protocol}-c{concurrency}"
    out_csv = LOG_DIR / f"{stem}.csv"
    out_csv.unlink(missing_ok=True)
    argv = [str(PA_BIN), "-m", model, "-u", server.url_for(wire), "-i", wire]
    argv += ["--concurrency-range", str(concurrency), *PA_STABILITY, "-f", str(out_csv), *extra]
    count0 = model_inference_count(server.url, model)
    cpu0, t0 = tree_cpu_seconds(server.proc.pid), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env_with_libs(PA_LIBS), timeout=300)
    cpu1, t1 = tree_cpu_seconds(server.proc.pid), time.monotonic()
    count1 = model_inference_count(server.url, model)
    pa_log = LOG_DIR / f"{stem}.pa.log"
    pa_log.write_text(done.stdout + done.stderr)
    if not out_csv.exists() and "Failed to obtain stable measurement" in done.stdout + done.stderr:
        raise UnstableError(f"perf_analyzer found no stable measurement of {server.name} {protocol} c={concurrency}")
    if server.proc.poll() is not None:
        raise BenchError(f"{server.name} exited with {server.proc.returncode} ({server.log}):\n{tail(server.log)}")
    if not out_csv.exists():
        why = pa_error(done.stdout + done.stderr)
        raise UnavailableError(f"perf_analyzer exit {done.returncode}: {why} ({pa_log})")
    row = parse_pa_csv(out_csv)
    if count0 is not None and count1 is not None and count1 > count0:
        inferences, source = count1 - count0, "server-stats"
    else:
        inferences, source = round(row["Inferences/Second"] * (t1 - t0)), "throughput*wall"
    return Measurement(
        protocol=protocol,
        concurrency=concurrency,
        infer_per_s=row["Inferences/Second"],
        p50_us=row["p50 latency"],
        p99_us=row["p99 latency"],
        cpu_us_per_infer=(cpu1 - cpu0) * 1e6 / max(inferences, 1),
        inferences=inferences,
        count_source=source,
        server_cpu_s=cpu1 - cpu0,
        wall_s=t1 - t0,
    )


def fmt(value: float | None, spec: str = ",.0f") -> str:
    """A number for a results table; "-" when there is none."""
    return "-" if value is None else format(value, spec)


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values present (one per round); None when no round gave one."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def with_rounds(values: list[float | None], spec: str = ".2f") -> str:
    """A ratio's median over rounds, then each round's own value in brackets when there are
    several: ``0.93 (0.91 / 0.93 / 0.97)``."""
    head = fmt(median(values), spec)
    return head if len(values) < 2 else f"{head} ({' / '.join(fmt(v, spec) for v in values)})"
