"""naiad bench's live progress line: drawn on a terminal while a level runs, silent elsewhere."""

from __future__ import annotations

import asyncio
import io

from naiad.tools.bench.progress import TICK_S, ProgressBar
from naiad.tools.loadgen.load import Recorder
from naiad.tools.loadgen.measure import Window, WindowSettings


def run_level(bar: ProgressBar) -> None:
    async def level() -> None:
        recorder, settings = Recorder(), WindowSettings(interval_s=1.0, max_trials=5)
        bar.start("Concurrency 4:", recorder, settings)
        recorder.latencies.extend([1_000_000] * 50)
        await asyncio.sleep(0.05)  # the first tick draws at once
        bar.on_window(0, Window(1.0, [2_000_000] * 120, 0, 0.0, None), settings)
        await asyncio.sleep(TICK_S + 0.1)  # the next tick is due before this wakes (timers fire in order)
        bar.stop()

    asyncio.run(level())


def test_the_line_shows_the_level_window_and_last_window_figures() -> None:
    stream = io.StringIO()
    run_level(ProgressBar(stream, enabled=True))
    text = stream.getvalue()
    assert "Concurrency 4: window 1/5 [" in text
    assert "Concurrency 4: window 2/5 [" in text and "last window 120 req/s, p99 2.00 ms" in text
    assert text.endswith("\r\x1b[2K")  # the line is cleared before the results print


def test_silent_off_a_terminal() -> None:
    stream = io.StringIO()  # not a tty
    run_level(ProgressBar(stream))
    assert stream.getvalue() == ""
