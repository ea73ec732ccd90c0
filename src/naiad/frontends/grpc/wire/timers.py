"""A re-armable deadline on the event loop: one per thing a connection times.

A `Timer` costs nothing until armed, and re-arming replaces its one handle, so a connection
keeps named attributes (`timers.keepalive`, `timers.idle`...) rather than a dict of handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Timer:
    """Calls `callback` once, `delay` seconds after `start`, unless cancelled or restarted."""

    __slots__ = ("_callback", "_handle")

    def __init__(self, callback: Callable[[], object]) -> None:
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def start(self, delay: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_later(delay, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()
