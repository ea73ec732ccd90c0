"""The default scheduler for instances that answer later: start at once where there is room,
queue in order where there is none, start queued work when room frees up."""

import threading
from collections.abc import Callable

from naiad.scheduling.base import Job
from naiad.scheduling.direct import DirectScheduler, can_start
from naiad.types import InferRequest


class FakeRunner:
    """An instance with `room` slots; `finish()` frees one, like a model process answering."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.started: list[str] = []
        self.on_room: Callable[[], None] | None = None
        self.lock = threading.Lock()

    def try_run(self, jobs: list[Job]) -> bool:
        with self.lock:
            if self.room == 0:
                return False
            self.room -= 1
            self.started.extend(j.request.id for j in jobs)
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        self.on_room = callback

    def finish(self) -> None:
        with self.lock:
            self.room += 1
        assert self.on_room is not None
        self.on_room()


def _job(i: int) -> Job:
    return Job(InferRequest("m", None, [], id=str(i)), lambda response: None)


def test_jobs_start_in_the_submitting_thread_while_there_is_room() -> None:
    runner = FakeRunner(room=2)
    scheduler = DirectScheduler([runner])
    scheduler.start()
    scheduler.submit(_job(0))
    scheduler.submit(_job(1))
    assert runner.started == ["0", "1"]  # no thread of the scheduler's own was involved
    scheduler.submit(_job(2))
    assert runner.started == ["0", "1"] and scheduler.pending() == 1


def test_queued_jobs_start_in_order_as_room_frees_up() -> None:
    runner = FakeRunner(room=1)
    scheduler = DirectScheduler([runner])
    scheduler.start()
    for i in range(4):
        scheduler.submit(_job(i))
    assert runner.started == ["0"] and scheduler.pending() == 3
    runner.finish()
    assert runner.started == ["0", "1"]
    runner.room += 5  # a burst of room: one callback starts everything queued
    runner.finish()
    assert runner.started == ["0", "1", "2", "3"] and scheduler.pending() == 0


def test_new_jobs_never_overtake_queued_ones() -> None:
    runner = FakeRunner(room=1)
    scheduler = DirectScheduler([runner])
    scheduler.start()
    scheduler.submit(_job(0))
    scheduler.submit(_job(1))  # queued
    runner.room += 1  # room appears without a callback yet
    scheduler.submit(_job(2))
    assert runner.started == ["0"]  # 2 waits behind 1 even though there is room
    runner.finish()
    assert runner.started == ["0", "1", "2"]


def test_instances_take_turns() -> None:
    first, second = FakeRunner(room=10), FakeRunner(room=10)
    scheduler = DirectScheduler([first, second])
    scheduler.start()
    for i in range(6):
        scheduler.submit(_job(i))
    assert first.started == ["0", "2", "4"] and second.started == ["1", "3", "5"]


def test_cancelled_jobs_are_dropped_instead_of_started() -> None:
    dropped: list[str] = []
    runner = FakeRunner(room=1)
    scheduler = DirectScheduler([runner], drop=lambda job, error: dropped.append(job.request.id))
    scheduler.start()
    scheduler.submit(_job(0))
    waiting = _job(1)
    scheduler.submit(waiting)
    waiting.cancelled = True  # the client went away while it waited
    runner.finish()
    assert runner.started == ["0"] and dropped == ["1"]


def test_only_runners_that_can_start_without_blocking_qualify() -> None:
    assert can_start(FakeRunner(room=1))
    assert not can_start(lambda jobs: None)
