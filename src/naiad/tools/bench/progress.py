"""A live progress line on a terminal: the load level, the window being taken, the answers so far
and the running throughput. Off a terminal (CI, a pipe) it stays quiet; results print either way."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO

from naiad.tools.loadgen.load import Recorder
from naiad.tools.loadgen.measure import Window, WindowSettings

BAR_WIDTH = 24
TICK_S = 0.25


class ProgressBar:
    """Redraws one line every TICK_S while a level runs."""

    def __init__(self, stream: TextIO = sys.stderr, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.label = ""
        self.recorder: Recorder | None = None
        self.settings: WindowSettings | None = None
        self.window = 0
        self.window_start = 0.0
        self.last: str = ""
        self._task: asyncio.Task[None] | None = None

    def start(self, label: str, recorder: Recorder, settings: WindowSettings) -> None:
        self.label, self.recorder, self.settings = label, recorder, settings
        self.window, self.window_start = 0, time.monotonic()
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._tick())

    def on_window(self, index: int, window: Window, settings: WindowSettings) -> None:
        self.window, self.window_start = index + 1, time.monotonic()
        self.last = f"last window {window.requests_per_s:,.0f} req/s, p99 {window.percentile_us(99) / 1000:.2f} ms"

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.enabled:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    async def _tick(self) -> None:
        while True:
            self._draw()
            await asyncio.sleep(TICK_S)

    def _draw(self) -> None:
        assert self.recorder is not None and self.settings is not None
        elapsed = time.monotonic() - self.window_start
        fraction = min(1.0, elapsed / self.settings.interval_s) if self.settings.interval_s else 1.0
        filled = int(fraction * BAR_WIDTH)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        rate = len(self.recorder.latencies) / elapsed if elapsed > 0 else 0.0
        text = (f"{self.label} window {self.window + 1}/{self.settings.max_trials} [{bar}] "
                f"{rate:,.0f} req/s {self.last}")
        self.stream.write("\r\x1b[2K" + text[:160])
        self.stream.flush()
