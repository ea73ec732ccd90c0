"""One minute of bench/soak.py in `make test`: mixed HTTP / gRPC / streaming / ensemble / LLM
traffic while `simple` is reloaded every 15 s and a Python model process is killed every 20 s.
Nothing fails but requests in flight on a killed process, and the server's RSS, descriptors,
threads and /dev/shm end where they started (`make soak` runs the ten-minute version)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_a_minute_of_mixed_traffic_with_reloads_and_killed_model_processes(example_repo: Path,
                                                                           tmp_path: Path) -> None:
    from conftest import running_server

    # bench/ on the path only for this import: left there, its modules (bench/llm.py) would shadow
    # the test packages of the same name (tests/llm) for the rest of the session.
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import soak
    finally:
        sys.path.remove(str(ROOT / "bench"))

    with running_server(soak.server_args(llm=True), tmp_path / "naiad.log") as server:
        result = soak.run(server, seconds=60, reload_every=15, kill_every=20, llm=True)
    assert soak.check(result) == [], result
    assert result["reloads"] >= 3 and result["kills"] >= 2
    assert result["ok"].get("http generate (llm)", 0) >= 5
