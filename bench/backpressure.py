"""Back-pressure: clients that send faster than the model computes must not grow the server's memory
without bound. Prints the server's RSS before, at its peak and after, for:

  * grpc-stream: one ModelStreamInfer stream pushing --requests requests of --kib KiB as fast as
    gRPC lets it, at an identity model that takes --delay-ms per request (one instance);
  * http: --connections HTTP connections, each sending requests back to back (HTTP/1.1 answers
    one request per connection at a time: at most one body per connection is held).

    .venv/bin/python bench/backpressure.py [--requests 400] [--kib 1024] [--delay-ms 5] [--connections 32]

Bounded: every part stops after its requests are answered or --limit-s seconds. Figures recorded in
docs/reliability.md.
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import ServerProcess  # noqa: E402

CONFIG = """
name: "slow"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay}" }} }}
"""


class RssSampler:
    """Samples a process's RSS every 20 ms in a thread; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def now(self) -> int:
        return int(self.process.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _mib(value: int) -> str:
    return f"{value / 2**20:7.1f} MiB"


def grpc_stream(server: ServerProcess, requests: int, kib: int, limit_s: float) -> int:
    answered: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answered.put(error or result))
    tensor = grpcclient.InferInput("INPUT0", [kib * 1024], "UINT8")
    tensor.set_data_from_numpy(np.zeros(kib * 1024, np.uint8))
    for _ in range(requests):
        client.async_stream_infer("slow", [tensor])
    deadline = time.monotonic() + limit_s
    done = 0
    while done < requests and time.monotonic() < deadline:
        try:
            answered.get(timeout=1)
            done += 1
        except queue.Empty:
            pass
    client.stop_stream(cancel_requests=True)
    client.close()
    return done


def http_connections(server: ServerProcess, connections: int, per_connection: int, kib: int) -> int:
    counts = [0] * connections

    def one(index: int) -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120)
        tensor = httpclient.InferInput("INPUT0", [kib * 1024], "UINT8")
        tensor.set_data_from_numpy(np.zeros(kib * 1024, np.uint8), binary_data=True)
        for _ in range(per_connection):
            client.infer("slow", [tensor])
            counts[index] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--kib", type=int, default=1024)
    parser.add_argument("--delay-ms", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--limit-s", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / "slow" / "1").mkdir(parents=True)
        (repo / "slow" / "config.pbtxt").write_text(CONFIG.format(delay=args.delay_ms))
        server = ServerProcess(["--model-repository", str(repo)], Path(tmp) / "naiad.log")
        try:
            server.wait_live()
            sent = args.requests * args.kib / 1024
            for name, run in (
                ("http", lambda: http_connections(server, args.connections,
                                                  max(1, args.requests // args.connections), args.kib)),
                ("grpc-stream", lambda: grpc_stream(server, args.requests, args.kib, args.limit_s)),
            ):
                sampler = RssSampler(server.process.pid)
                before = sampler.now()
                started = time.monotonic()
                answered = run()
                took = time.monotonic() - started
                time.sleep(1.0)
                sampler.stop()
                print(f"{name:12s} answered {answered:5d} in {took:5.1f} s ({sent:.0f} MiB sent)  RSS before "
                      f"{_mib(before)}  peak {_mib(sampler.peak)} (+{_mib(sampler.peak - before).strip()})  "
                      f"after {_mib(sampler.now())}", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
