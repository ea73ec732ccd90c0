"""`naiad tune` end to end: a real naiad server, a Python-backend model whose best config is known
(tests/tools/tune/models/tunable: 80 ms per execution of up to 8 rows, 4x that beyond, instances
in parallel), configs changed through the repository API while the server keeps running."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, running_server

from naiad.config.model_config import parse_config_text

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).parent / "models"
SEARCH = ["--p99-ms", "1000", "--max-instances", "3", "--max-batch-sizes", "4,8,16", "--queue-delays-us", "off,0",
          "--measurement-interval", "500", "--min-requests", "8", "--max-concurrency", "32"]


def served_config(url: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/tunable/config", timeout=10) as answer:
        return json.loads(answer.read())


def tune(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "naiad.cli", "tune", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODELS / "tunable", tmp_path / "repo" / "tunable")
    return tmp_path / "repo"


def test_tune_finds_the_known_optimum_on_a_running_server_and_restores_it(repo: Path, tmp_path: Path) -> None:
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "tunable"]
    with running_server(args, tmp_path / "naiad.log") as server:
        before = served_config(server.url)
        done = tune([str(repo / "tunable"), "--url", server.url, *SEARCH, "--confirm-rounds", "1",
                     "-o", str(tmp_path / "out")], timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        assert server.process.poll() is None  # the same server all along: nothing restarted it
        assert served_config(server.url) == before  # the original config is back
    best = parse_config_text((tmp_path / "out/config.pbtxt").read_text(), "best")
    assert best.instance_group[0].count == 3  # instances sleep in parallel: the most is best
    assert best.max_batch_size == 8  # 4 is half as fast, 16 a quarter per row past 8
    assert best.HasField("dynamic_batching")  # one row per execution otherwise
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert len(report["trials"]) < 3 * 3 * 2 * 3 / 2  # pruned: not the grid
    instance_only = [t for t in report["trials"][1:3] if t["config"]["max_batch_size"] == "4"]
    assert instance_only and all(t["in_place"] for t in instance_only)  # instance counts change in place
    assert report["best_confirmed_throughput"] > 3 * report["start_confirmed_throughput"]
    assert (repo / "tunable/config.pbtxt").read_text() == (MODELS / "tunable/config.pbtxt").read_text()
    page = (tmp_path / "out/report.html").read_text()
    assert "<svg" in page and "Pareto front" in page


def test_tune_serves_the_model_itself_without_a_url(repo: Path, tmp_path: Path) -> None:
    done = tune([str(repo / "tunable"), *SEARCH, "--time-budget", "0", "--confirm-rounds", "0",
                 "-o", str(tmp_path / "out")], timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert len(report["trials"]) == 1  # no time: the start alone, measured
    assert report["chosen"] == report["start"]
    assert parse_config_text((tmp_path / "out/config.pbtxt").read_text(), "out").max_batch_size == 4
    assert "naiad serve" in done.stdout


def test_tune_refuses_a_server_not_in_explicit_mode(repo: Path, tmp_path: Path) -> None:
    with running_server(["--model-repository", str(repo)], tmp_path / "naiad.log") as server:
        done = tune([str(repo / "tunable"), "--url", server.url, *SEARCH, "--time-budget", "30",
                     "--confirm-rounds", "0", "-o", str(tmp_path / "out")], timeout=200)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "explicit model load / unload is not allowed" in done.stderr
    assert "--model-control-mode explicit" in done.stderr
    assert not (tmp_path / "out/config.pbtxt").exists()


def test_tune_stops_when_the_models_own_config_fails_its_requests(tmp_path: Path) -> None:
    shutil.copytree(MODELS / "failing", tmp_path / "repo" / "failing")
    done = tune([str(tmp_path / "repo/failing"), *SEARCH, "--time-budget", "120", "-o", str(tmp_path / "out")],
                timeout=200)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "this model always fails" in done.stderr and "--input-data" in done.stderr
    assert "[ 1]" not in done.stdout  # no trial was reported: the search never started
    assert not (tmp_path / "out/config.pbtxt").exists()
