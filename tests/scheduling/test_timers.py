"""The schedulers' timers, on a thread of their own and on an event loop: deadlines, order,
cancellation, re-arming earlier, close."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest
import uvloop

from naiad.scheduling.timers import Timers

MS = 1_000_000


class _LoopThread:
    """A uvloop event loop running on a thread, as the server's frontends' loop does."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(params=["thread", "loop"])
def timers(request: pytest.FixtureRequest) -> Iterator[Timers]:
    timers = Timers("test-timers")
    loop = _LoopThread() if request.param == "loop" else None
    if loop is not None:
        timers.serve_on(loop.loop)
    yield timers
    timers.close()
    if loop is not None:
        loop.stop()


def test_callbacks_run_at_their_deadlines_in_deadline_order(timers: Timers) -> None:
    fired: list[tuple[str, int]] = []
    done, start = threading.Event(), time.monotonic_ns()
    for name, delay_ms in (("c", 30), ("a", 10), ("b", 20)):
        timers.call_at(start + delay_ms * MS, lambda name=name: fired.append((name, time.monotonic_ns())))
    timers.call_at(start + 40 * MS, done.set)
    assert done.wait(5)
    assert [name for name, _ in fired] == ["a", "b", "c"]
    for (name, at), delay_ms in zip(fired, (10, 20, 30), strict=True):
        assert at >= start + delay_ms * MS, name  # never early


def test_an_earlier_deadline_armed_while_the_thread_sleeps_fires_on_time(timers: Timers) -> None:
    """The thread sleeps on the timer of a deadline far away; a new, earlier one must wake it then,
    not when the far one comes (the timerfd is moved, nobody notifies the thread)."""
    far, soon = threading.Event(), threading.Event()
    start = time.monotonic_ns()
    timers.call_at(start + 60_000 * MS, far.set)
    time.sleep(0.05)  # the thread is asleep on the far deadline now
    timers.call_at(time.monotonic_ns() + 20 * MS, soon.set)
    assert soon.wait(5), "the earlier deadline waited for the later one"
    assert not far.is_set()


def test_a_deadline_already_passed_runs_at_once(timers: Timers) -> None:
    done = threading.Event()
    timers.call_at(time.monotonic_ns() - 10 * MS, done.set)
    assert done.wait(5)


def test_cancelled_timers_do_not_run(timers: Timers) -> None:
    ran, done, start = [], threading.Event(), time.monotonic_ns()
    first = timers.call_at(start + 10 * MS, lambda: ran.append("first"))
    timers.call_at(start + 20 * MS, lambda: ran.append("second"))
    timers.call_at(start + 30 * MS, done.set)
    first.cancel()
    assert done.wait(5)
    assert ran == ["second"]


def test_a_callback_may_cancel_another_due_at_the_same_time(timers: Timers) -> None:
    ran, done = [], threading.Event()
    when = time.monotonic_ns() + 20 * MS
    handles = {}
    handles["a"] = timers.call_at(when, lambda: (ran.append("a"), handles["b"].cancel()))
    handles["b"] = timers.call_at(when, lambda: ran.append("b"))
    timers.call_at(when + 10 * MS, done.set)
    assert done.wait(5)
    assert ran == ["a"]


def test_a_failing_callback_does_not_stop_the_others(timers: Timers) -> None:
    done = threading.Event()
    start = time.monotonic_ns()

    def fail() -> None:
        raise RuntimeError("a scheduler bug")

    timers.call_at(start + 5 * MS, fail)
    timers.call_at(start + 10 * MS, done.set)
    assert done.wait(5)


def test_a_callback_can_arm_the_next_timer(timers: Timers) -> None:
    done = threading.Event()
    count = [0]

    def again() -> None:
        count[0] += 1
        if count[0] == 5:
            done.set()
        else:
            timers.call_at(time.monotonic_ns() + 2 * MS, again)

    timers.call_at(time.monotonic_ns() + 2 * MS, again)
    assert done.wait(5)


def test_close_stops_the_thread_and_drops_what_is_armed() -> None:
    timers = Timers("test-close")
    ran = []
    timers.call_at(time.monotonic_ns() + 50 * MS, lambda: ran.append("armed before close"))
    thread = timers._thread
    assert thread is not None
    timers.close()
    assert not thread.is_alive()
    timers.call_at(time.monotonic_ns(), lambda: ran.append("armed after close"))
    time.sleep(0.1)
    assert ran == []


def test_timers_served_on_a_loop_run_callbacks_on_its_thread_and_start_no_thread_of_their_own() -> None:
    loop = _LoopThread()
    timers = Timers("test-loop-served")
    timers.serve_on(loop.loop)
    ran_on, done = [], threading.Event()
    try:
        # armed from another thread (a worker's completion does this) while the loop sleeps
        timers.call_at(time.monotonic_ns() + 5 * MS, lambda: (ran_on.append(threading.current_thread()), done.set()))
        assert done.wait(5)
        assert ran_on == [loop.thread]
        assert timers._thread is None
    finally:
        timers.close()
        loop.stop()


def test_close_on_a_loop_stops_watching_and_closes_the_timerfd() -> None:
    loop = _LoopThread()
    timers = Timers("test-loop-close")
    timers.serve_on(loop.loop)
    ran: list[str] = []
    timers.call_at(time.monotonic_ns() + 50 * MS, lambda: ran.append("armed before close"))
    assert timers._timer is not None
    fd = timers._timer.fd
    timers.close()
    timers.close()  # twice is harmless (the server's stop and a test's teardown may both close)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _is_open(fd):
        time.sleep(0.01)
    assert not _is_open(fd)
    timers.call_at(time.monotonic_ns(), lambda: ran.append("armed after close"))
    time.sleep(0.1)
    assert ran == []
    loop.stop()


def test_close_after_the_loop_closed_still_closes_the_timerfd() -> None:
    loop = asyncio.new_event_loop()
    timers = Timers("test-closed-loop")
    timers.serve_on(loop)
    assert timers._timer is not None
    fd = timers._timer.fd
    loop.close()
    timers.close()
    assert not _is_open(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
