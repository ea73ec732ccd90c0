"""Soak: mixed traffic while a model is reloaded and Python model processes are killed.

    .venv/bin/python bench/soak.py [--minutes 10] [--reload-every 30] [--kill-every 60] [--no-llm]

Serves the example repositories (examples/models and, unless --no-llm, examples/llm's SmolLM2) in
explicit mode and runs, until the time is up:
  * HTTP infer on `simple` (ONNX) and gRPC infer on `identity`, one client each, back to back;
  * a gRPC stream of `simple` requests (ModelStreamInfer);
  * two HTTP clients on `minilm_embed` (an ensemble: python tokenizer → ONNX encoder with dynamic
    batching → python pooling);
  * a short HTTP generate on `smollm2` every few seconds (the LLM);
while `simple` is reloaded every --reload-every seconds (a config override that changes a
parameter, so the model really reloads) and one of the Python model processes is killed with
SIGKILL every --kill-every seconds. Every request must succeed, except minilm_embed requests in
flight on a killed process, which must fail with the backend's "not healthy" error. After a
warm-up, the server's RSS (its whole process tree), open file descriptors, threads and the
entries of /dev/shm are sampled; they must end where they started, within bounds.

tests/e2e/test_soak.py runs one minute of it in `make test`; `make soak` runs the full ten.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = "is not healthy"  # what requests in flight on a killed model process fail with
#: How far the sampled resources may move between the first and the last sample.
RSS_GROWTH_MB = 64
FD_GROWTH = 8
THREAD_GROWTH = 8


@dataclass
class Tally:
    ok: Counter[str] = field(default_factory=Counter)
    allowed: Counter[str] = field(default_factory=Counter)  # failed in flight on a killed process
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, error: BaseException | None, killable: bool = False) -> None:
        with self.lock:
            if error is None:
                self.ok[name] += 1
            elif killable and ALLOWED in str(error):
                self.allowed[name] += 1
            else:
                self.failed.append(f"{name}: {error}")


def _tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return found


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def sample(server_pid: int) -> dict[str, float]:
    status = Path(f"/proc/{server_pid}/status").read_text()
    threads = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:"))
    return {"rss_mb": round(_rss_mb(_tree(server_pid)), 1), "fds": len(os.listdir(f"/proc/{server_pid}/fd")),
            "threads": threads, "dev_shm": len(os.listdir("/dev/shm"))}


def _stubs(server_pid: int) -> list[int]:
    """The Python model processes of the server (its children running the stub)."""
    stubs = []
    for pid in _tree(server_pid)[1:]:
        try:
            if b"naiad.backends.python.stub" in Path(f"/proc/{pid}/cmdline").read_bytes():
                stubs.append(pid)
        except OSError:
            continue
    return stubs


def _simple_inputs(module: Any) -> list[Any]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        tensors.append(tensor)
    return tensors


def _http_simple(server: Any, stop: threading.Event, tally: Tally) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        while not stop.is_set():
            try:
                result = client.infer("simple", _simple_inputs(httpclient))
                assert result.as_numpy("OUTPUT0").shape == (1, 16)
                tally.add("http simple", None)
            except Exception as error:
                tally.add("http simple", error)


def _grpc_identity(server: Any, stop: threading.Event, tally: Tally) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    while not stop.is_set():
        try:
            tensor = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
            tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUTPUT0"), data)
            tally.add("grpc identity", None)
        except Exception as error:
            tally.add("grpc identity", error)
    client.close()


def _grpc_stream(server: Any, stop: threading.Event, tally: Tally) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    while not stop.is_set():
        client.async_stream_infer("simple", _simple_inputs(grpcclient))
        try:
            _, error = answers.get(timeout=30)
            tally.add("grpc stream", error)
        except queue.Empty:
            tally.add("grpc stream", TimeoutError("no answer on the stream in 30 s"))
    client.stop_stream()
    client.close()


def _embeddings(server: Any, stop: threading.Event, tally: Tally) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a sentence to embed while models come and go"]], dtype=np.object_))
        while not stop.is_set():
            try:
                assert client.infer("minilm_embed", [text]).as_numpy("EMBEDDING").shape == (1, 384)
                tally.add("http minilm_embed", None)
            except Exception as error:
                tally.add("http minilm_embed", error, killable=True)


def _generate(server: Any, stop: threading.Event, tally: Tally) -> None:
    body = json.dumps({"text_input": "The capital of France is", "parameters": {"max_tokens": 8}}).encode()
    while not stop.wait(3.0):
        try:
            request = urllib.request.Request(f"http://{server.url}/v2/models/smollm2/generate", data=body,
                                             method="POST")
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert answer.status == 200 and b"text_output" in answer.read()
            tally.add("http generate (llm)", None)
        except Exception as error:
            tally.add("http generate (llm)", error)


def _reload_simple(server: Any, round_: int) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("simple")
        config["parameters"] = {"soak_round": {"string_value": str(round_)}}
        client.load_model("simple", config=json.dumps(config))


def run(server: Any, seconds: float, reload_every: float, kill_every: float, llm: bool,
        warmup: float = 10.0) -> dict[str, Any]:
    """Drive `server` (a tests/conftest.py ServerProcess on the example repositories) for
    `seconds`; returns the tallies, the reloads, the kills and the resource samples."""
    tally, stop = Tally(), threading.Event()
    workers = [_http_simple, _grpc_identity, _grpc_stream, _embeddings, _embeddings]
    if llm:
        workers.append(_generate)
    threads = [threading.Thread(target=w, args=(server, stop, tally), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    pid = server.process.pid
    time.sleep(warmup)
    first = sample(pid)
    start = time.monotonic()
    next_reload, next_kill = start + reload_every, start + kill_every
    reloads, kills, errors = 0, 0, []
    rng = random.Random(0)
    while time.monotonic() - start < seconds:
        now = time.monotonic()
        if now >= next_reload:
            reloads += 1
            try:
                _reload_simple(server, reloads)
            except Exception as error:
                errors.append(f"reload {reloads}: {error}")
            next_reload += reload_every
        if now >= next_kill:
            stubs = _stubs(pid)
            if stubs:
                os.kill(rng.choice(stubs), signal.SIGKILL)
                kills += 1
            next_kill += kill_every
        time.sleep(0.2)
    time.sleep(3.0)  # let the last kill's restart finish before the final sample
    last = sample(pid)
    stop.set()
    for thread in threads:
        thread.join(90)
    return {"seconds": seconds, "reloads": reloads, "kills": kills, "reload_errors": errors,
            "ok": dict(tally.ok), "failed_in_flight_on_killed_process": dict(tally.allowed),
            "failed": tally.failed, "first": first, "last": last}


def check(result: dict[str, Any]) -> list[str]:
    """What went wrong in a run (empty when it passed)."""
    problems = [f"unexpected failure: {f}" for f in result["failed"][:20]]
    problems += result["reload_errors"]
    first, last = result["first"], result["last"]
    if last["rss_mb"] - first["rss_mb"] > RSS_GROWTH_MB:
        problems.append(f"RSS grew from {first['rss_mb']} to {last['rss_mb']} MB")
    if last["fds"] - first["fds"] > FD_GROWTH:
        problems.append(f"file descriptors grew from {first['fds']} to {last['fds']}")
    if last["threads"] - first["threads"] > THREAD_GROWTH:
        problems.append(f"threads grew from {first['threads']} to {last['threads']}")
    if last["dev_shm"] != first["dev_shm"]:
        problems.append(f"/dev/shm entries went from {first['dev_shm']} to {last['dev_shm']}")
    for name in ("http simple", "grpc identity", "grpc stream", "http minilm_embed"):
        if not result["ok"].get(name):
            problems.append(f"no successful '{name}' request")
    return problems


def server_args(llm: bool) -> list[str]:
    args = ["--model-repository", str(ROOT / "examples/models"), "--model-control-mode", "explicit",
            "--load-model", "*"]
    return args + (["--model-repository", str(ROOT / "examples/llm")] if llm else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--reload-every", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--no-llm", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import running_server

    log = ROOT / ".bench/logs/soak-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with running_server(server_args(not args.no_llm), log) as server:
        result = run(server, args.minutes * 60, args.reload_every, args.kill_every, not args.no_llm)
    problems = check(result)
    print(json.dumps(result, indent=1))
    print("\n".join(problems) if problems else "soak passed")
    out = ROOT / ".bench/results" / f"soak-{time.strftime('%Y-%m-%dT%H%M%S', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "problems": problems}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
