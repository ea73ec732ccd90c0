"""`naiad bench` end to end: the CLI against real naiad servers over HTTP, gRPC (naiad's HTTP/2
and grpc-core's), shared memory, request rates, an LLM, and in process; its files and errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, ServerProcess, free_port, running_server

from naiad.tools.bench.report import EXTRA_COLUMNS, PA_COLUMNS

pytestmark = pytest.mark.e2e

FAST = ["--shape", "INPUT0:16", "-p", "300", "-s", "100", "-r", "3", "--no-progress"]


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "naiad.cli", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def inference_count(url: str) -> int:
    with urllib.request.urlopen(f"http://{url}/v2/models/identity/stats", timeout=10) as answer:
        return sum(int(s["inference_count"]) for s in json.loads(answer.read())["model_stats"])


@pytest.fixture(scope="module")
def server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit", "--load-model", "identity",
            "--allow-client-shm", "true"]
    with running_server(args, tmp_path_factory.mktemp("bench") / "naiad.log") as process:
        yield process


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_http_sweep_writes_perf_analyzer_columns_json_and_charts(server: ServerProcess, tmp_path: Path) -> None:
    before = inference_count(server.url)
    done = bench("identity", "-u", server.url, "--concurrency-range", "1,4", *FAST, "-f", str(tmp_path / "pa.csv"),
                 "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    served = inference_count(server.url) - before
    with (tmp_path / "pa.csv").open() as f:
        header = f.readline().strip().split(",")
    assert header == ["Concurrency", *PA_COLUMNS, *EXTRA_COLUMNS]  # perf_analyzer's names, in its order
    table = rows(tmp_path / "pa.csv")
    assert [r["Concurrency"] for r in table] == ["1", "4"]
    for row in table:
        assert float(row["Inferences/Second"]) > 0 and row["Errors"] == "0"
        assert int(row["p50 latency"]) <= int(row["p99 latency"])
        assert float(row["Avg batch"]) >= 1.0  # the server-side split came from the statistics extension
        assert int(row["Server Compute Infer"]) > 0
    report = json.loads((tmp_path / "out/identity-http.json").read_text())
    measured = sum(r["requests"] for r in report["results"])
    assert 0 < measured <= served  # every request counted was one the server answered
    assert "<svg" in (tmp_path / "out/identity-http.html").read_text()
    assert (tmp_path / "out/identity-http.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Concurrency 4:" in done.stdout and "server (µs per request): queue" in done.stdout


@pytest.mark.parametrize("shm", ["none", "system"])
def test_grpc_and_shared_memory(server: ServerProcess, tmp_path: Path, shm: str) -> None:
    for protocol, url in (("grpc", server.grpc_url), ("http", server.url)):
        done = bench("identity", "-u", url, "-i", protocol, "--concurrency-range", "2", "--shared-memory", shm,
                     *FAST, "-f", str(tmp_path / f"{protocol}.csv"))
        assert done.returncode == 0, done.stdout + done.stderr
        (row,) = rows(tmp_path / f"{protocol}.csv")
        assert row["Errors"] == "0" and float(row["Inferences/Second"]) > 0
    status = urllib.request.urlopen(f"http://{server.url}/v2/systemsharedmemory/status", timeout=10).read()
    assert json.loads(status) == []  # every region the run registered is gone


def test_grpc_against_grpc_core_transport(example_repo: Path, tmp_path: Path) -> None:
    """The lean HTTP/2 client against grpc-core's own server (HPACK dynamic table, flow control)."""
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit", "--load-model", "identity",
            "--grpc-transport", "grpcio"]
    with running_server(args, tmp_path / "naiad.log") as grpcio_server:
        done = bench("identity", "-u", grpcio_server.grpc_url, "-i", "grpc", "--concurrency-range", "1,8",
                     "--grpc-streams-per-connection", "4", *FAST, "--shape", "INPUT0:20000",
                     "-f", str(tmp_path / "g.csv"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["Errors"] for r in rows(tmp_path / "g.csv")] == ["0", "0"]  # 80 KB requests: beyond one window


def test_request_rate_mode_keeps_the_rate(server: ServerProcess, tmp_path: Path) -> None:
    done = bench("identity", "-u", server.url, "--request-rate-range", "100", "--shape", "INPUT0:16", "-p", "1500",
                 "-s", "100", "-r", "3", "--no-progress", "-f", str(tmp_path / "r.csv"))
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = rows(tmp_path / "r.csv")
    assert next(iter(row)) == "Request Rate" and row["Request Rate"] == "100.0"
    assert 70 <= float(row["Inferences/Second"]) <= 130  # Poisson arrivals at 100/s over 4.5 s


def test_in_process(example_repo: Path, tmp_path: Path) -> None:
    done = bench("identity", "--in-process", "--model-repository", str(example_repo), "--concurrency-range", "2",
                 *FAST, "-f", str(tmp_path / "i.csv"))
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = rows(tmp_path / "i.csv")
    assert row["Errors"] == "0" and float(row["Server Compute Infer"]) > 0


def test_errors_are_clear(server: ServerProcess, tmp_path: Path) -> None:
    done = bench("nope", "-u", server.url, *FAST)
    assert done.returncode == 1 and "unknown model" in done.stderr.lower()
    done = bench("identity", "-u", f"127.0.0.1:{free_port()}", *FAST)
    assert done.returncode == 1 and "cannot connect" in done.stderr
    done = bench("identity", "-u", server.url, *FAST, "--shape", "INPUT0:16,2")
    assert done.returncode == 1 and "does not fit" in done.stderr
    done = bench("identity", "-u", server.url, "--concurrency-range", "0", *FAST)
    assert done.returncode == 2 and "positive" in done.stderr


def test_failing_requests_stop_the_run_with_the_servers_error(example_repo: Path, tmp_path: Path) -> None:
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit", "--load-model", "identity",
            "--http-max-input-size", "100"]
    with running_server(args, tmp_path / "naiad.log") as small:
        done = bench("identity", "-u", small.url, "--shape", "INPUT0:1000", "-p", "300", "--no-progress")
    assert done.returncode == 1
    assert "HTTP" in done.stderr


def test_llm_figures(tmp_path: Path) -> None:
    from e2e.llm_server import CONFIG, MODEL, wait_model_ready

    (tmp_path / "repo" / MODEL / "1").mkdir(parents=True)
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
    llm = ServerProcess(["--model-repository", str(tmp_path / "repo")], tmp_path / "llm.log")
    try:
        llm.wait_live(timeout=300)  # the engine takes a minute to start on a busy 2-core machine
        wait_model_ready(llm)
        done = bench(MODEL, "-u", llm.url, "--prompt-tokens", "40", "--output-tokens", "6", "--concurrency-range",
                     "1,2", "--request-count", "4", "--output-dir", str(tmp_path / "out"), timeout=300)
    finally:
        llm.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / f"out/{MODEL}-llm.json").read_text())
    assert [r["concurrency"] for r in report["results"]] == [1, 2]
    for result in report["results"]:
        assert result["output_tokens"]["avg"] == 6  # ignore_eos: exactly what was asked for
        assert 30 <= result["prompt_tokens"]["avg"] <= 50  # calibrated against the server's tokenizer
        assert 0 < result["ttft_ms"]["p50"] <= result["latency_ms"]["p50"]
        assert result["itl_ms"]["avg"] > 0 and result["output_token_throughput"] > 0
    with (tmp_path / f"out/{MODEL}-llm-c1.csv").open() as f:
        assert f.readline().strip() == "Metric,avg,min,max,p99,p90,p75"
    assert "Time To First Token (ms)" in done.stdout
