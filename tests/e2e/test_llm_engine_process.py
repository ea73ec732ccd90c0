"""The llm backend's engine core runs in a process of its own: killing it fails the open request
with an error (the server goes on) and the model reports not ready; stopping the server ends it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from e2e.llm_server import MODEL, llm_server
from e2e.raw_http import post

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(child) for child in text)
    return children


def _engine_cores(server_pid: int) -> list[int]:
    """The server's children running multiprocessing's spawn entry point (the engine core)."""
    cores = []
    for child in _children(server_pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except FileNotFoundError:
            continue
        if b"multiprocessing.spawn" in command and b"spawn_main" in command:
            cores.append(child)
    return cores


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_killed_engine_core_fails_its_request_and_the_model_goes_not_ready(tmp_path: Path) -> None:
    with llm_server(tmp_path / "repo") as server:
        (core,) = _engine_cores(server.process.pid)
        # A long generation; the core is killed while it runs.
        body = {"text_input": "Count from one to a thousand:", "max_tokens": 400, "ignore_eos": True,
                "temperature": 0}
        killer_started = time.monotonic()
        def kill_soon() -> None:
            time.sleep(1.0)
            os.kill(core, signal.SIGKILL)

        threading.Thread(target=kill_soon, daemon=True).start()
        answer = post(server.url, f"/v2/models/{MODEL}/generate", json.dumps(body).encode(),
                      {"Content-Type": "application/json"}, timeout=120)
        assert answer.status == 500, answer.body
        assert "engine" in answer.error()
        assert time.monotonic() - killer_started < 60
        assert server.get(f"/v2/models/{MODEL}/ready") != 200
        assert server.get("/v2/health/live") == 200  # the server itself goes on
    assert server.process.returncode is not None


def test_stopping_the_server_ends_its_engine_core(tmp_path: Path) -> None:
    with llm_server(tmp_path / "repo") as server:
        cores = _engine_cores(server.process.pid)
        assert len(cores) == 1
        answer = post(server.url, f"/v2/models/{MODEL}/generate",
                      json.dumps({"text_input": "Hi", "max_tokens": 2}).encode(),
                      {"Content-Type": "application/json"}, timeout=60)
        assert answer.status == 200, answer.body
    deadline = time.monotonic() + 30
    while _alive(cores[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(cores[0])
