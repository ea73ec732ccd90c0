"""Load over a target's slots: closed-loop concurrency, or an open-loop request rate.

- `ConcurrencyLoad(c)`: c slots, each sends its next request as soon as its last one is answered
  (perf_analyzer's `--concurrency-range`).
- `RateLoad(r)`: requests start on a schedule, Poisson (exponential gaps) or constant, whether or
  not earlier ones have been answered (perf_analyzer's `--request-rate-range`); a request whose
  time comes while every slot is busy opens another slot, up to `max_slots`, else waits for one
  and is counted as *delayed* (as perf_analyzer does; latency runs from the actual send, as
  there, so a run with delayed requests under-reports latency and says so).

Every answer goes to a `Recorder` whose lists the measurement windows take in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from naiad.tools.loadgen.target import Bodies, Target


class Recorder:
    """Latencies (ns) of the requests answered since the last `take`, and the errors."""

    __slots__ = ("errors", "first_error", "latencies")

    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.errors = 0
        self.first_error = ""

    def take(self) -> tuple[list[int], int]:
        """The latencies and the error count since the last call; the recorder starts afresh."""
        taken, self.latencies = self.latencies, []
        errors, self.errors = self.errors, 0
        return taken, errors


class ConcurrencyLoad:
    """`concurrency` requests in flight at all times."""

    def __init__(self, target: Target, bodies: Bodies, concurrency: int, recorder: Recorder) -> None:
        self.target, self.bodies, self.concurrency, self.recorder = target, bodies, concurrency, recorder
        self.running = False
        self.in_flight = 0
        self._drained: asyncio.Future[None] | None = None

    async def start(self) -> None:
        slots = await self.target.open_slots(self.concurrency, self.bodies, self._done)
        self.running = True
        self.in_flight = len(slots)
        for slot in slots:
            slot.send()

    def _done(self, slot: Any, ok: bool, latency_ns: int, error: str) -> None:
        recorder = self.recorder
        if ok:
            recorder.latencies.append(latency_ns)
        else:
            recorder.errors += 1
            if not recorder.first_error:
                recorder.first_error = error
        if self.running:
            slot.send()
            return
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Send nothing more and wait for the requests in flight (at most `timeout_s`)."""
        self.running = False
        if self.in_flight:
            self._drained = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, timeout_s)


class RateLoad:
    """Requests started at `rate` per second on average, whatever the answers do."""

    def __init__(self, target: Target, bodies: Bodies, rate: float, recorder: Recorder,
                 poisson: bool = True, max_slots: int = 256, seed: int = 0) -> None:
        if rate <= 0:
            raise ValueError(f"request rate must be positive, got {rate}")
        self.target, self.bodies, self.rate, self.recorder = target, bodies, rate, recorder
        self.poisson, self.max_slots = poisson, max_slots
        self.random = random.Random(seed)
        self.idle: list[Any] = []
        self.slots = 0
        self.opening = 0
        self.backlog = 0  # starts that are due and wait for a free slot
        self.delayed = 0
        self.running = False
        self.in_flight = 0
        self._next = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None

    async def start(self) -> None:
        first = min(self.max_slots, max(1, int(self.rate * 0.01) + 1))  # ~10 ms of requests
        self.idle = await self.target.open_slots(first, self.bodies, self._done)
        self.slots = len(self.idle)
        self.running = True
        self._next = time.monotonic()
        self._fire()

    def _gap(self) -> float:
        return self.random.expovariate(self.rate) if self.poisson else 1.0 / self.rate

    def _fire(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        while self._next <= now:  # every start that is due (timers fire late, by up to a millisecond)
            self._start()
            self._next += self._gap()
        self._timer = asyncio.get_running_loop().call_later(self._next - now, self._fire)

    def _start(self) -> None:
        if self.idle:
            self.in_flight += 1
            self.idle.pop().send()
            return
        self.backlog += 1
        self.delayed += 1
        if self.slots + self.opening < self.max_slots:
            self.opening += 1
            asyncio.get_running_loop().create_task(self._open_one())

    async def _open_one(self) -> None:
        try:
            (slot,) = await self.target.open_slots(1, self.bodies, self._done)
        finally:
            self.opening -= 1
        self.slots += 1
        self._release(slot)

    def _release(self, slot: Any) -> None:
        if self.running and self.backlog:
            self.backlog -= 1
            self.in_flight += 1
            slot.send()
        else:
            self.idle.append(slot)

    def _done(self, slot: Any, ok: bool, latency_ns: int, error: str) -> None:
        recorder = self.recorder
        if ok:
            recorder.latencies.append(latency_ns)
        else:
            recorder.errors += 1
            if not recorder.first_error:
                recorder.first_error = error
        self.in_flight -= 1
        self._release(slot)
        if not self.running and self.in_flight == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def stop(self, timeout_s: float = 30.0) -> None:
        self.running = False
        self.backlog = 0
        if self._timer is not None:
            self._timer.cancel()
        if self.in_flight:
            self._drained = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, timeout_s)
