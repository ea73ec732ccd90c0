"""Closed-loop concurrency and open-loop request rates, over a fake target with a set service time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from naiad.tools.loadgen.load import ConcurrencyLoad, RateLoad, Recorder


class Slot:
    def __init__(self, target: FakeTarget, done: Any) -> None:
        self.target, self.done = target, done

    def send(self, t0: int = 0) -> None:
        self.target.in_flight += 1
        self.target.peak = max(self.target.peak, self.target.in_flight)
        asyncio.get_running_loop().call_later(self.target.service_s, self._answer)

    def _answer(self) -> None:
        self.target.in_flight -= 1
        self.done(self, True, int(self.target.service_s * 1e9), "")


class FakeTarget:
    def __init__(self, service_s: float) -> None:
        self.service_s, self.in_flight, self.peak, self.opened = service_s, 0, 0, 0

    async def open_slots(self, count: int, bodies: Any, done: Any) -> list[Slot]:
        self.opened += count
        return [Slot(self, done) for _ in range(count)]


def test_concurrency_keeps_exactly_c_requests_in_flight() -> None:
    async def run() -> tuple[FakeTarget, Recorder, float]:
        target, recorder = FakeTarget(0.005), Recorder()
        load = ConcurrencyLoad(target, lambda i: [b""], 4, recorder)  # type: ignore[arg-type]
        started = time.monotonic()
        await load.start()
        while len(recorder.latencies) < 40:
            await asyncio.sleep(0.01)
        await load.stop()
        return target, recorder, time.monotonic() - started

    target, recorder, elapsed = asyncio.run(asyncio.wait_for(run(), 30))
    assert target.peak == 4 and target.in_flight == 0  # stop() drained what was in flight
    # Each slot sends its next request only after its last answer (>= 5 ms): at most 4 per 5 ms.
    assert 40 <= len(recorder.latencies) <= 4 * elapsed / 0.005


def test_rate_opens_slots_when_busy_and_counts_delays() -> None:
    async def run() -> tuple[FakeTarget, Recorder, RateLoad, float]:
        target, recorder = FakeTarget(0.05), Recorder()  # 50 ms each at 200/s: ~10 in flight
        load = RateLoad(target, lambda i: [b""], 200.0, recorder, poisson=False, max_slots=64)  # type: ignore[arg-type]
        started = time.monotonic()
        await load.start()
        await asyncio.sleep(0.5)
        elapsed = time.monotonic() - started
        await load.stop()
        return target, recorder, load, elapsed

    target, recorder, load, elapsed = asyncio.run(run())
    # Starts follow the schedule (late timers catch up), never run ahead of it: one per 5 ms.
    assert 50 <= len(recorder.latencies) <= elapsed * 200 + 1
    assert target.opened >= 8 and target.peak <= target.opened  # ~10 in flight needed more than the first 3
    assert target.opened < len(recorder.latencies) / 3  # slots are reused, not opened per request
    assert load.delayed >= target.opened - 3  # each new slot was opened for a start that found none free
