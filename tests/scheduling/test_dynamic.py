"""The dynamic batcher with a controllable fake instance: assertions on which jobs ran together,
in what order, and on lower bounds of waiting, never on wall-clock luck. Every test runs twice:
with batches handed to the instances (model processes) and pulled by their threads (framework
backends); the rules are the same."""

import sys
import threading
import time

import pytest

from naiad.errors import Unavailable
from naiad.scheduling.base import Job
from naiad.scheduling.dynamic import TIMEOUT_DELAY, BatcherSettings, DynamicBatcher, QueuePolicy
from naiad.scheduling.timers import Timers
from naiad.types import InferRequest
from scheduling.workers import PullWorker, threads

SECOND = 1_000_000_000


class Instance:
    """A runner that records batches; `hold()` keeps it busy until `release()`."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.started: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.busy = threading.Event()
        self.done = threading.Condition()

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def __call__(self, jobs: list[Job]) -> None:
        self.started.append(time.monotonic_ns())
        self.busy.set()
        self.gate.wait(10)
        with self.done:
            self.batches.append([job.request.id for job in jobs])
            self.done.notify_all()
        for job in jobs:
            job.sink(job.request.id)

    def wait_batches(self, count: int) -> list[list[str]]:
        with self.done:
            assert self.done.wait_for(lambda: len(self.batches) >= count, 10), self.batches
        return self.batches


def _job(name: str, size: int = 1, priority: int = 0, timeout_ns: int = 0, shape: tuple = (4,), sink=None) -> Job:
    job = Job(InferRequest("m", None, [], id=name), sink or (lambda response: None))
    job.batch_size, job.shape_key, job.priority = size, shape, priority
    job.deadline_ns = job.enqueued_ns + timeout_ns if timeout_ns else 0
    return job


FEEDING = "handed"


@pytest.fixture(autouse=True, params=["handed", "pulled"])
def feeding(request, monkeypatch):
    """How the instances get their batches (see the module docstring)."""
    monkeypatch.setattr(sys.modules[__name__], "FEEDING", request.param)
    return request.param


def _new(runners, settings: BatcherSettings, drop) -> DynamicBatcher:
    """A batcher over one instance per runner, fed as this run of the test says."""
    if FEEDING == "pulled":
        pullers = [PullWorker(runner) for runner in runners]
        return DynamicBatcher(pullers, settings, drop, Timers(), pullers=pullers)
    return DynamicBatcher(threads(*runners), settings, drop, Timers())


def _batcher(instance, dropped=None, instances: int = 1, **settings) -> DynamicBatcher:
    settings.setdefault("max_batch_size", 8)
    drop = lambda job, error: (dropped if dropped is not None else []).append((job, error))  # noqa: E731
    batcher = _new([instance] * instances, BatcherSettings(**settings), drop)
    batcher.start()
    return batcher


def _busy(batcher: DynamicBatcher, instance: Instance) -> None:
    """Occupy the single instance with a blocker job so later jobs queue up."""
    instance.hold()
    instance.busy.clear()
    batcher.submit(_job("blocker", size=8))
    assert instance.busy.wait(5)


def test_preferred_sizes_run_at_once_and_a_lone_request_waits_the_whole_delay():
    instance = Instance()
    batcher = _batcher(instance, preferred_batch_sizes=(2, 6), max_queue_delay_ns=SECOND // 5)
    batcher.submit(_job("two", size=2))
    batcher.submit(_job("six", size=6))
    assert instance.wait_batches(2) == [["two"], ["six"]]
    lone = _job("one")
    batcher.submit(lone)
    assert instance.wait_batches(3)[2] == ["one"]
    assert instance.started[2] - lone.enqueued_ns >= SECOND // 5
    batcher.stop()


def test_two_queued_single_requests_run_as_one_batch_of_two():
    instance = Instance()
    batcher = _batcher(instance, preferred_batch_sizes=(2, 6), max_queue_delay_ns=10 * SECOND)
    _busy(batcher, instance)
    batcher.submit(_job("a"))
    batcher.submit(_job("b"))
    instance.release()
    assert instance.wait_batches(2)[1] == ["a", "b"]
    batcher.stop()


def test_without_delay_whatever_is_queued_runs_together_up_to_max_batch_size():
    instance = Instance()
    batcher = _batcher(instance, max_batch_size=4)
    _busy(batcher, instance)
    for name, size in [("a", 1), ("b", 2), ("c", 2), ("d", 1)]:
        batcher.submit(_job(name, size))
    instance.release()
    assert instance.wait_batches(3)[1:] == [["a", "b"], ["c", "d"]]
    batcher.stop()


def test_only_equal_shapes_batch_together():
    instance = Instance()
    batcher = _batcher(instance)
    _busy(batcher, instance)
    batcher.submit(_job("a", shape=(4,)))
    batcher.submit(_job("b", shape=(5,)))
    batcher.submit(_job("c", shape=(4,)))
    instance.release()
    assert instance.wait_batches(4)[1:] == [["a"], ["b"], ["c"]]
    batcher.stop()


def test_higher_priority_runs_first():
    instance = Instance()
    batcher = _batcher(instance, max_batch_size=1, priority_levels=3, default_priority_level=2)
    _busy_one = _job("blocker")
    instance.hold()
    batcher.submit(_busy_one)
    assert instance.busy.wait(5)
    batcher.submit(_job("low", priority=3))
    batcher.submit(_job("default"))
    batcher.submit(_job("high", priority=1))
    batcher.submit(_job("invalid-goes-to-default", priority=9))
    instance.release()
    assert instance.wait_batches(5)[1:] == [["high"], ["default"], ["invalid-goes-to-default"], ["low"]]
    batcher.stop()


def test_queue_overflow_rejects_exactly_the_overflowing_request():
    instance = Instance()
    batcher = _batcher(instance, default_policy=QueuePolicy(max_queue_size=2))
    _busy(batcher, instance)
    batcher.submit(_job("a", size=8))
    batcher.submit(_job("b", size=8))
    with pytest.raises(Unavailable, match="Exceeds maximum queue size"):
        batcher.submit(_job("c", size=8))
    instance.release()
    assert instance.wait_batches(3)[1:] == [["a"], ["b"]]
    batcher.stop()


def test_reject_timeout_drops_the_request_with_an_error():
    instance, dropped = Instance(), []
    batcher = _batcher(instance, dropped, default_policy=QueuePolicy(default_timeout_ns=SECOND // 20))
    _busy(batcher, instance)
    late = _job("late", size=8)
    batcher.submit(late)
    time.sleep(0.1)  # past its deadline while the instance is held
    instance.release()
    instance.wait_batches(1)
    batcher.stop()
    assert [(job.request.id, str(error)) for job, error in dropped] == [("late", "Request timeout expired")]
    assert instance.batches == [["blocker"]]


def test_delay_timeout_moves_the_request_behind_the_others():
    instance = Instance()
    # Only "expires" has a short timeout: "fresh" cannot expire too, however late the instance
    # thread gets to look at the queue on a busy machine.
    policy = QueuePolicy(timeout_action=TIMEOUT_DELAY, default_timeout_ns=60 * SECOND, allow_timeout_override=True)
    batcher = _batcher(instance, max_batch_size=1, default_policy=policy)
    instance.hold()
    batcher.submit(_job("blocker"))
    assert instance.busy.wait(5)
    batcher.submit(_job("expires", timeout_ns=SECOND // 20))
    time.sleep(0.1)  # "expires" is past its deadline now
    batcher.submit(_job("fresh"))
    instance.release()
    assert instance.wait_batches(3)[1:] == [["fresh"], ["expires"]]
    batcher.stop()


def test_request_timeout_override_only_when_allowed_and_only_shorter():
    instance, dropped = Instance(), []
    policy = QueuePolicy(default_timeout_ns=60 * SECOND, allow_timeout_override=True)
    batcher = _batcher(instance, dropped, default_policy=policy)
    _busy(batcher, instance)
    batcher.submit(_job("short", size=8, timeout_ns=SECOND // 20))
    time.sleep(0.1)
    instance.release()
    instance.wait_batches(1)
    batcher.stop()
    assert [job.request.id for job, _ in dropped] == ["short"]


def test_request_timeout_is_ignored_without_override():
    instance, dropped = Instance(), []
    batcher = _batcher(instance, dropped)
    _busy(batcher, instance)
    batcher.submit(_job("keeps", size=8, timeout_ns=1))
    time.sleep(0.05)
    instance.release()
    assert instance.wait_batches(2)[1] == ["keeps"] and not dropped
    batcher.stop()


def test_cancelled_requests_leave_the_queue_without_running():
    instance, dropped = Instance(), []
    batcher = _batcher(instance, dropped)
    _busy(batcher, instance)
    gone, kept = _job("gone", size=8), _job("kept", size=8)
    batcher.submit(gone)
    batcher.submit(kept)
    gone.cancel()
    instance.release()
    assert instance.wait_batches(2)[1] == ["kept"]
    batcher.stop()
    assert [(job.request.id, error) for job, error in dropped] == [("gone", None)]


def test_a_request_cancelled_before_it_is_queued_leaves_without_running():
    # The queues are scanned for cancelled jobs only after a cancel since they were last found
    # clean: a job that comes already cancelled must be found all the same.
    instance, dropped = Instance(), []
    batcher = _batcher(instance, dropped)
    _busy(batcher, instance)
    early, other, kept = _job("early", size=8), _job("other", size=8), _job("kept", size=8)
    early.cancel()
    batcher.submit(other)  # its turn of the pump finds the queue clean after that cancel
    batcher.submit(early)
    batcher.submit(kept)
    instance.release()
    assert instance.wait_batches(3)[1:] == [["other"], ["kept"]]
    batcher.stop()
    assert [(job.request.id, error) for job, error in dropped] == [("early", None)]


def test_preserve_ordering_delivers_responses_in_arrival_order():
    delivered: list[str] = []
    slow_started = threading.Event()
    release_slow = threading.Event()
    second_answered = threading.Event()

    def runner(jobs: list[Job]) -> None:
        if jobs[0].request.id == "first":
            slow_started.set()
            release_slow.wait(10)
        for job in jobs:
            job.sink(job.request.id)
        if jobs[0].request.id == "second":
            second_answered.set()

    batcher = _new([runner, runner], BatcherSettings(max_batch_size=1, preserve_ordering=True), lambda job, error: None)
    batcher.start()
    batcher.submit(_job("first", sink=delivered.append))
    assert slow_started.wait(5)
    batcher.submit(_job("second", sink=delivered.append))
    assert second_answered.wait(5)  # "second" has finished on the other instance...
    assert delivered == []  # ...but must not be delivered before "first"
    release_slow.set()
    batcher.stop()
    assert delivered == ["first", "second"]


def test_stop_runs_what_is_queued_without_waiting_for_the_delay():
    instance = Instance()
    batcher = _batcher(instance, max_queue_delay_ns=60 * SECOND)
    batcher.submit(_job("a"))
    batcher.stop()
    assert instance.batches == [["a"]]


def test_preserve_ordering_does_not_wait_for_a_cancelled_request():
    delivered: list[str] = []
    instance = Instance()
    batcher = _new([instance], BatcherSettings(max_batch_size=8, preserve_ordering=True), lambda job, error: None)
    batcher.start()
    _busy(batcher, instance)
    gone, kept = _job("gone", size=8, sink=delivered.append), _job("kept", size=8, sink=delivered.append)
    batcher.submit(gone)
    batcher.submit(kept)
    gone.cancel()
    instance.release()
    batcher.stop()
    assert delivered == ["kept"]


def test_preserve_ordering_survives_a_rejected_request():
    delivered: list[str] = []
    instance = Instance()
    settings = BatcherSettings(max_batch_size=8, preserve_ordering=True, default_policy=QueuePolicy(max_queue_size=1))
    batcher = _new([instance], settings, lambda job, error: None)
    batcher.start()
    _busy(batcher, instance)
    batcher.submit(_job("kept", size=8, sink=delivered.append))
    with pytest.raises(Unavailable):
        batcher.submit(_job("rejected", size=8, sink=delivered.append))
    instance.release()
    instance.wait_batches(2)
    batcher.submit(_job("later", size=8, sink=delivered.append))  # must not wait for "rejected"
    batcher.stop()
    assert delivered == ["kept", "later"]
