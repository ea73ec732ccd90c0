"""Measurement windows, stability and the server-side split."""

from __future__ import annotations

import asyncio
import time

import pytest

from naiad.tools.loadgen.load import Recorder
from naiad.tools.loadgen.measure import Window, WindowSettings, is_stable, measure, percentile
from naiad.tools.loadgen.stats import snapshot, split


def window(rps: float, latency_us: float) -> Window:
    return Window(1.0, [int(latency_us * 1000)] * int(rps), 0, 0.0, None)


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7], 99) == 7 and percentile([], 50) == 0.0


def test_stability_needs_throughput_and_latency_within_the_percentage() -> None:
    assert is_stable([window(100, 1000), window(105, 1020), window(98, 990)], 10.0)
    assert not is_stable([window(100, 1000), window(140, 1000), window(100, 1000)], 10.0)
    assert not is_stable([window(100, 1000), window(100, 1500), window(100, 1000)], 10.0)


def test_measure_takes_windows_until_stable_and_merges_the_last() -> None:
    async def run() -> object:
        recorder = Recorder()
        stop = asyncio.Event()

        async def steady_load() -> None:  # 1 answer per ms of the clock (not per wake-up: a busy machine
            started, answered = time.monotonic(), 0  # wakes late), 2 ms each
            while not stop.is_set():
                due = int((time.monotonic() - started) * 1000)
                recorder.latencies.extend([2_000_000] * (due - answered))
                answered = due
                await asyncio.sleep(0.005)

        task = asyncio.create_task(steady_load())
        try:
            return await measure(recorder, WindowSettings(interval_s=0.1, stability_pct=50.0, max_trials=6), None,
                                 "m", "concurrency", 4, batch_size=2)
        finally:
            stop.set()
            await task

    m = asyncio.run(run())
    assert m.stable and len(m.window_throughputs) == 3
    assert m.latency_us(99) == pytest.approx(2000.0)
    assert m.throughput == pytest.approx(2 * m.request_throughput)  # inferences = requests x batch


def test_server_split_from_http_and_grpc_statistics() -> None:
    def stats(count: int, ns: int, grpc: bool = False) -> dict:
        def d(c: int, n: int) -> dict:
            return {"count": str(c), "ns": str(n)} if grpc else {"count": c, "ns": n}

        infer = {"success": d(count, ns), "queue": d(count, ns // 4), "compute_input": d(count, ns // 10),
                 "compute_infer": d(count, ns // 2), "compute_output": d(count, ns // 10)}
        if grpc and count == 0:
            infer = {}  # gRPC's JSON leaves zeros out
        return {"model_stats": [{"name": "m", "version": "1", "inference_count": str(count * 2) if grpc else count * 2,
                                 "execution_count": count, "inference_stats": infer},
                                {"name": "other", "inference_count": 99}]}

    for grpc in (False, True):
        result = split(snapshot(stats(0, 0, grpc), "m"), snapshot(stats(10, 10_000_000, grpc), "m"))
        assert result is not None
        assert result.requests == 10 and result.avg_batch == 2.0
        assert result.server_us == pytest.approx(1000.0) and result.queue_us == pytest.approx(250.0)
        assert result.compute_infer_us == pytest.approx(500.0)
    assert split(snapshot(stats(10, 100, False), "m"), snapshot(stats(3, 10, False), "m")) is None  # reset
