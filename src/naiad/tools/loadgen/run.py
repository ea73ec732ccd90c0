"""One load level, start to finish: open slots, load, measure until stable, drain, close."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from naiad.tools.loadgen.load import ConcurrencyLoad, RateLoad, Recorder
from naiad.tools.loadgen.measure import Measurement, Progress, WindowSettings, measure
from naiad.tools.loadgen.plan import RequestPlan


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """A concurrency (closed loop) or a request rate per second (open loop)."""

    mode: str  # "concurrency" or "request_rate"
    value: float

    def __str__(self) -> str:
        return f"c={int(self.value)}" if self.mode == "concurrency" else f"rate={self.value:g}/s"


@dataclass(frozen=True, slots=True)
class RateSettings:
    poisson: bool = True
    max_slots: int = 256


async def run_level(plan: RequestPlan, level: LoadLevel, windows: WindowSettings,
                    progress: Progress | None = None, rate: RateSettings | None = None,
                    server_stats: bool = True, recorder: Recorder | None = None,
                    warmup_s: float = 0.0) -> Measurement:
    """Drive `plan.target` at `level` and measure it (after `warmup_s` of load not measured)."""
    target, recorder = plan.target, recorder or Recorder()
    load: ConcurrencyLoad | RateLoad
    if level.mode == "concurrency":
        if plan.settings.shared_memory == "system":
            await plan.ensure_shm(int(level.value))
        load = ConcurrencyLoad(target, plan.bodies, int(level.value), recorder)
    else:
        rate = rate or RateSettings()
        if plan.settings.shared_memory == "system":
            await plan.ensure_shm(rate.max_slots)
        load = RateLoad(target, plan.bodies, level.value, recorder, rate.poisson, rate.max_slots)

    async def stats() -> dict[str, Any] | None:
        return await target.statistics(plan.spec.name, plan.version)

    await load.start()
    try:
        if warmup_s > 0:
            await asyncio.sleep(warmup_s)
        return await measure(recorder, windows, stats if server_stats else None, plan.spec.name, level.mode,
                             level.value, plan.settings.batch_size, progress,
                             delayed=(lambda: load.delayed) if isinstance(load, RateLoad) else None)
    finally:
        await load.stop()
        await target.close_slots()
