"""The `naiad serve` child of a Ray Serve replica (naiad.integrations.naiad_process), without Ray.

When naiad fails a request it should have answered, the replica raises `describe()`: what became
of the process and the end of its log (which goes with the replica otherwise).
"""

from __future__ import annotations

import signal
from pathlib import Path

from naiad.integrations.naiad_process import NaiadProcess


def test_describe_says_the_child_was_killed_and_shows_its_log(tmp_path: Path) -> None:
    naiad = NaiadProcess(tmp_path, ["--log-verbose", "1"])
    try:
        assert naiad.describe().startswith(f"naiad serve (pid {naiad.process.pid}) is running")
        naiad.process.send_signal(signal.SIGKILL)
        state = naiad.describe(wait=10)
        assert f"(pid {naiad.process.pid}) was killed by signal 9 (Killed)" in state
        log = state.split("the end of its log:\n", 1)[1]
        assert log and log == naiad.log_tail()  # what the server wrote before it died
    finally:
        naiad.stop()

