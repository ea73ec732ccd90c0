"""Callbacks at monotonic deadlines, run on the event loop or one thread: queue delays and timeouts of schedulers.

Schedulers start batches from whoever has news (see base.PumpedScheduler); the only news nobody
brings is "time passed": a batch that waited its max_queue_delay, a request whose timeout ran out,
a sequence that went idle. Each scheduler keeps at most one timer armed, for the earliest of these.
Callbacks run one at a time (on the event loop's thread or the timer thread) and must not block.

The deadlines live on a Linux timerfd set to the earliest one. Setting it from the thread that
arms a timer wakes nobody: the kernel makes the fd readable once, at the deadline. (A condition
variable had to be notified of each new earliest deadline; the woken thread then asked for the GIL
while the event loop held it, and a request waiting out a 200 µs queue delay cost the server ~100
CPU-µs in hand-offs: docs/benchmarks.md, 2026-12-05 afternoon.)

Who waits on the fd: a server that has an event loop hands it to `serve_on`, and the loop watches
the fd beside its sockets, so callbacks run on the loop's thread, between its other callbacks. A
batch whose delay ran out is then formed and sent by the thread that already holds the GIL and
sends every other batch, instead of a second thread that must be woken and take the GIL from it
(py_mlp at c=1 spent 65-70 CPU-µs per inference on that thread). Without a loop (tests, embedded
use) a daemon thread of its own blocks on the fd. (The loop's own `call_at` will not do: uvloop's
timers count whole milliseconds, and queue delays are hundreds of microseconds.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1  # time.monotonic_ns()'s clock on Linux
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_TIMER_ABSTIME = 1


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = _libc.timerfd_create
_timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_timerfd_create.restype = ctypes.c_int
_timerfd_settime = _libc.timerfd_settime
_timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_ITimerSpec), ctypes.c_void_p]
_timerfd_settime.restype = ctypes.c_int


class _TimerFd:
    """A one-shot, non-blocking CLOCK_MONOTONIC timerfd: `set` from any thread, `wait` on one."""

    def __init__(self) -> None:
        # Non-blocking: a loop told "readable" may find the expiry gone (re-armed since) and must
        # not block; the thread that waits polls first (`wait`).
        fd = _timerfd_create(_CLOCK_MONOTONIC, _TFD_CLOEXEC | _TFD_NONBLOCK)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_create: {os.strerror(error)}")
        self.fd = fd
        self._spec = _ITimerSpec()  # reused: `set` is called under the Timers lock
        self._poller: select.poll | None = None  # made by the first `wait`

    def set(self, when_ns: int) -> None:
        """Expire at monotonic time `when_ns` (at once if it passed); 0 disarms."""
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(when_ns, 1_000_000_000)
        if _timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_settime: {os.strerror(error)}")

    def wait(self) -> None:
        """Block (without the GIL) until the timer expires; a disarmed timer never does."""
        poller = self._poller
        if poller is None:  # poll, not select: the fd may be numbered past select's 1,024
            poller = self._poller = select.poll()
            poller.register(self.fd, select.POLLIN)
        poller.poll()
        self.consume()

    def consume(self) -> None:
        """Clear an expiry, if one is still pending (re-arming since may have cleared it)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)  # the count of expirations, not needed

    def close(self) -> None:
        os.close(self.fd)


class TimerHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A heap of (deadline, callback), served by an event loop (`serve_on`) or else by one daemon
    thread started on first use."""

    def __init__(self, name: str = "naiad-timers") -> None:
        self._name = name
        self._heap: list[tuple[int, int, TimerHandle]] = []
        self._order = itertools.count()  # ties run in the order they were armed
        self._lock = threading.Lock()
        self._timer: _TimerFd | None = None
        self._set_ns = 0  # the deadline the timerfd is set to (0: disarmed)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run every callback on `loop`'s thread from now on; call before the first `call_at`."""
        with self._lock:
            if self._thread is not None or self._loop is not None:
                raise RuntimeError("timers already served")
            self._timer = _TimerFd()
            self._loop = loop
        # Thread-safe, and level-triggered: a deadline that passes before the loop gets to this
        # still finds the fd readable.
        loop.call_soon_threadsafe(loop.add_reader, self._timer.fd, self._on_readable)

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` (on the loop's thread, or the timer thread) once time.monotonic_ns()
        reaches `when_ns`."""
        handle = TimerHandle(callback)
        with self._lock:
            if self._closed:
                return handle
            heapq.heappush(self._heap, (when_ns, next(self._order), handle))
            if self._timer is None:
                self._timer = _TimerFd()
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if self._heap[0][2] is handle:
                self._set(max(when_ns, 1))  # the new earliest deadline (0 would disarm)
        return handle

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._heap.clear()
            if self._timer is not None:
                self._set(1)  # long past: the thread wakes at once and sees `_closed`
        thread, loop, timer = self._thread, self._loop, self._timer
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
            if not thread.is_alive() and timer is not None:
                timer.close()
        if loop is not None and timer is not None:
            try:
                loop.call_soon_threadsafe(self._detach, loop, timer)
            except RuntimeError:  # the loop is closed: nothing watches the fd any more
                timer.close()

    @staticmethod
    def _detach(loop: asyncio.AbstractEventLoop, timer: _TimerFd) -> None:
        loop.remove_reader(timer.fd)
        timer.close()

    def _set(self, when_ns: int) -> None:
        """Under the lock: have the timerfd expire at `when_ns` (0 disarms), unless it already does."""
        if when_ns != self._set_ns:
            assert self._timer is not None
            self._timer.set(when_ns)
            self._set_ns = when_ns

    def _run(self) -> None:
        timer = self._timer
        assert timer is not None
        while not self._closed:
            timer.wait()
            self._expired()

    def _on_readable(self) -> None:
        assert self._timer is not None
        self._timer.consume()
        self._expired()

    def _expired(self) -> None:
        """The timerfd fired: run what is due, and set it to the next deadline."""
        with self._lock:
            self._set_ns = 0  # expired: a one-shot timer is disarmed now
            if self._closed:
                return
            due = self._take_due(time.monotonic_ns())
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
            if self._heap:
                self._set(self._heap[0][0])
        for handle in due:
            if handle.cancelled:  # by a callback before it
                continue
            try:
                handle.callback()
            except Exception:  # a scheduler bug must not stop every other scheduler's timers
                log.exception("timer callback failed")

    def _take_due(self, now: int) -> list[TimerHandle]:
        """Under the lock: pop the handles whose deadline came, in deadline order."""
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            handle = heapq.heappop(heap)[2]
            if not handle.cancelled:
                due.append(handle)
        return due
