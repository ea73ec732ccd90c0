"""The default scheduler: each job runs alone, in order, on an instance with room; jobs start from
the thread that has news (a submit, an executed batch, an instance with room again)."""

import threading
import time

import pytest

from naiad.errors import Unavailable
from naiad.scheduling.base import Job
from naiad.scheduling.default import DefaultScheduler, SharedQueueScheduler
from naiad.scheduling.timers import Timers
from naiad.types import InferRequest
from scheduling.workers import FakeWorker, PullWorker, threads


def _job(i: int, done: list | None = None) -> Job:
    return Job(InferRequest("m", None, [], id=str(i)), (done if done is not None else []).append)


def _scheduler(workers, dropped: list | None = None) -> DefaultScheduler:
    drops = dropped if dropped is not None else []
    return DefaultScheduler(workers, lambda job, error: drops.append((job, error)), Timers())


def test_every_job_runs_once_and_alone():
    ran: list[list[str]] = []
    lock = threading.Lock()

    def runner(jobs: list[Job]) -> None:
        with lock:
            ran.append([j.request.id for j in jobs])

    scheduler = _scheduler(threads(runner, runner))
    scheduler.start()
    for i in range(50):
        scheduler.submit(_job(i))
    deadline = time.monotonic() + 10
    while len(ran) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.stop()
    assert sorted(int(batch[0]) for batch in ran) == list(range(50))
    assert all(len(batch) == 1 for batch in ran)


def test_an_idle_instance_takes_work_while_another_is_busy():
    release = threading.Event()
    busy = threading.Event()
    started: list[str] = []

    def slow(jobs: list[Job]) -> None:
        started.append("slow")
        busy.set()
        release.wait(5)

    def fast(jobs: list[Job]) -> None:
        started.append("fast")
        busy.set()
        release.wait(5)

    scheduler = _scheduler(threads(slow, fast))
    scheduler.start()
    scheduler.submit(_job(0))
    assert busy.wait(5)  # one instance now holds the first job
    ran_first = started[0]

    other = next(r for r in ("slow", "fast") if r != ran_first)
    scheduler.submit(_job(1))
    deadline = time.monotonic() + 5
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == [ran_first, other]  # the idle one took it, not the busy one
    release.set()
    scheduler.stop()


def test_queued_jobs_wait_for_start_then_run_in_order():
    worker = FakeWorker(room=10)
    scheduler = _scheduler([worker])
    for i in range(5):
        scheduler.submit(_job(i))
    assert scheduler.pending() == 5 and worker.started == []
    scheduler.start()
    assert worker.started == ["0", "1", "2", "3", "4"] and scheduler.pending() == 0


def test_cancelled_jobs_are_dropped_not_run():
    dropped: list[tuple[Job, object]] = []
    worker = FakeWorker(room=10)
    scheduler = _scheduler([worker], dropped)
    gone, kept = _job(1), _job(2)
    gone.cancel()
    scheduler.submit(gone)
    scheduler.submit(kept)
    scheduler.start()
    assert worker.started == ["2"] and dropped == [(gone, None)]


# -- instances that hold several batches (model processes) and may refuse some ------------------


def test_jobs_start_in_the_submitting_thread_while_there_is_room() -> None:
    worker = FakeWorker(room=2)
    scheduler = _scheduler([worker])
    scheduler.start()
    scheduler.submit(_job(0))
    scheduler.submit(_job(1))
    assert worker.started == ["0", "1"]  # no thread of the scheduler's own was involved
    scheduler.submit(_job(2))
    assert worker.started == ["0", "1"] and scheduler.pending() == 1


def test_an_instance_gets_no_more_batches_than_its_depth() -> None:
    worker = FakeWorker(room=100, depth=2)
    scheduler = _scheduler([worker])
    scheduler.start()
    for i in range(4):
        scheduler.submit(_job(i))
    assert worker.started == ["0", "1"] and scheduler.pending() == 2
    worker.finish()  # one executed: one more may go
    assert worker.started == ["0", "1", "2"]


def test_queued_jobs_start_in_order_as_room_frees_up() -> None:
    worker = FakeWorker(room=1)
    scheduler = _scheduler([worker])
    scheduler.start()
    for i in range(4):
        scheduler.submit(_job(i))
    assert worker.started == ["0"] and scheduler.pending() == 3
    worker.finish()
    assert worker.started == ["0", "1"]
    worker.room += 5  # a burst of room: one callback starts everything queued
    worker.finish()
    assert worker.started == ["0", "1", "2", "3"] and scheduler.pending() == 0


def test_new_jobs_never_overtake_queued_ones() -> None:
    worker = FakeWorker(room=1)
    scheduler = _scheduler([worker])
    scheduler.start()
    scheduler.submit(_job(0))
    scheduler.submit(_job(1))  # queued
    worker.room += 1  # room appears without a callback yet
    scheduler.submit(_job(2))
    assert worker.started == ["0"]  # 2 waits behind 1 even though there is room
    worker.finish()
    assert worker.started == ["0", "1", "2"]


def test_instances_take_turns() -> None:
    first, second = FakeWorker(room=10), FakeWorker(room=10)
    scheduler = _scheduler([first, second])
    scheduler.start()
    for i in range(6):
        scheduler.submit(_job(i))
    assert first.started == ["0", "2", "4"] and second.started == ["1", "3", "5"]


def test_cancelled_jobs_are_dropped_instead_of_started() -> None:
    dropped: list[tuple[Job, object]] = []
    worker = FakeWorker(room=1)
    scheduler = _scheduler([worker], dropped)
    scheduler.start()
    scheduler.submit(_job(0))
    waiting = _job(1)
    scheduler.submit(waiting)
    waiting.cancel()  # the client went away while it waited
    worker.finish()
    assert worker.started == ["0"] and [job.request.id for job, _ in dropped] == ["1"]


def test_an_instance_answering_inside_run_starts_the_next_job_without_deadlock() -> None:
    """A worker may report its batch executed before `run` returns (an instance answering at
    once): the scheduler then starts the next queued job, from the same thread."""
    started: list[str] = []

    class Inline:
        depth = 1

        def run(self, jobs, executed):
            started.extend(j.request.id for j in jobs)
            executed()
            return True

        def set_on_room(self, callback):
            pass

    scheduler = _scheduler([Inline()])
    for i in range(3):
        scheduler.submit(_job(i))
    scheduler.start()
    assert started == ["0", "1", "2"]


# -- SharedQueueScheduler: the default scheduler for instances with threads of their own ----------


def _shared(workers, dropped: list | None = None) -> SharedQueueScheduler:
    drops = dropped if dropped is not None else []
    return SharedQueueScheduler(workers, lambda job, error: drops.append((job, error)))


def _wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_shared_queue_runs_every_job_once_alone_and_in_order_on_one_instance():
    ran: list[list[str]] = []
    scheduler = _shared([PullWorker(lambda jobs: ran.append([j.request.id for j in jobs]))])
    scheduler.start()
    for i in range(50):
        scheduler.submit(_job(i))
    assert _wait_until(lambda: len(ran) == 50)
    scheduler.stop()
    assert ran == [[str(i)] for i in range(50)]


def test_shared_queue_an_idle_instance_takes_the_next_job_while_another_is_busy():
    release = threading.Event()
    ran: list[tuple[str, str]] = []  # (job, instance)

    def runner(instance: str):
        def run(jobs: list[Job]) -> None:
            ran.append((jobs[0].request.id, instance))
            if jobs[0].request.id == "0":
                release.wait(10)

        return run

    scheduler = _shared([PullWorker(runner("a")), PullWorker(runner("b"))])
    scheduler.start()
    scheduler.submit(_job(0))
    assert _wait_until(lambda: len(ran) == 1)
    stuck = ran[0][1]  # whichever instance took job 0 is stuck on it
    for i in range(1, 20):
        scheduler.submit(_job(i))
    # The other one serves every job after it.
    assert _wait_until(lambda: len(ran) == 20)
    assert {instance for job, instance in ran[1:]} == {"b" if stuck == "a" else "a"}
    release.set()
    scheduler.stop()


def test_shared_queue_drops_a_cancelled_job_instead_of_running_it():
    release = threading.Event()
    ran: list[str] = []

    def runner(jobs: list[Job]) -> None:
        ran.append(jobs[0].request.id)
        release.wait(10)

    dropped: list = []
    scheduler = _shared([PullWorker(runner)], dropped)
    scheduler.start()
    scheduler.submit(_job(0))
    assert _wait_until(lambda: ran == ["0"])
    gone, kept = _job(1), _job(2)
    scheduler.submit(gone)
    scheduler.submit(kept)
    assert scheduler.pending() == 2  # queued behind the busy instance
    gone.cancel()
    release.set()
    assert _wait_until(lambda: ran == ["0", "2"])
    scheduler.stop()
    assert dropped == [(gone, None)]


def test_shared_queue_stop_runs_what_is_queued_waits_for_it_then_refuses_new_jobs():
    ran: list[str] = []

    def runner(jobs: list[Job]) -> None:
        time.sleep(0.01)
        ran.append(jobs[0].request.id)

    worker = PullWorker(runner)
    scheduler = _shared([worker])
    scheduler.start()
    for i in range(10):
        scheduler.submit(_job(i))
    scheduler.stop()  # returns once the instance executed everything it accepted
    assert ran == [str(i) for i in range(10)]
    assert worker.thread is not None and _wait_until(lambda: not worker.thread.is_alive(), 5)
    with pytest.raises(Unavailable):
        scheduler.submit(_job(10))


def test_shared_queue_runs_a_job_on_the_submitting_thread_when_an_idle_instance_lets_it():
    ran: list[tuple[str, threading.Thread]] = []
    scheduler = _shared([PullWorker(lambda jobs: ran.append((jobs[0].request.id, threading.current_thread())),
                                    here=True)])
    scheduler.start()
    scheduler.submit(_job(0))
    assert ran == [("0", threading.current_thread())]  # executed before submit returned
    scheduler.stop()


def test_shared_queue_queues_a_job_behind_waiting_ones_instead_of_running_it_here():
    ran: list[tuple[str, str]] = []
    worker = PullWorker(lambda jobs: ran.append((jobs[0].request.id, threading.current_thread().name)))
    scheduler = _shared([worker])
    scheduler.submit(_job(0))  # the instance does not let it run here: it waits (no thread yet)
    worker.here = True
    scheduler.submit(_job(1))  # it would let this one, but job 0 waits: behind it
    assert ran == [] and scheduler.pending() == 2
    scheduler.start()
    assert _wait_until(lambda: len(ran) == 2)
    scheduler.stop()
    assert [job for job, _ in ran] == ["0", "1"]
    assert all(name != threading.current_thread().name for _, name in ran)  # on the instance's thread


def test_shared_queue_a_job_waits_for_the_instances_thread_while_the_instance_is_busy():
    release = threading.Event()
    ran: list[tuple[str, str]] = []

    def runner(jobs: list[Job]) -> None:
        ran.append((jobs[0].request.id, threading.current_thread().name))
        if jobs[0].request.id == "0":
            release.wait(10)

    worker = PullWorker(runner, here=True)
    scheduler = _shared([worker])
    scheduler.start()
    submitter = threading.Thread(target=scheduler.submit, args=(_job(0),), name="submitter")
    submitter.start()  # runs on that thread, and holds the instance
    assert _wait_until(lambda: len(ran) == 1)
    scheduler.submit(_job(1))  # the instance is busy: not here, but on its thread once it is free
    release.set()
    submitter.join(10)
    assert _wait_until(lambda: len(ran) == 2)
    scheduler.stop()
    assert worker.thread is not None
    assert ran == [("0", "submitter"), ("1", worker.thread.name)]


def test_shared_queue_never_runs_more_jobs_at_once_than_there_are_instances():
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, most ever
    done: list[str] = []

    def runner(jobs: list[Job]) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.0005)
        with lock:
            running[0] -= 1
            done.append(jobs[0].request.id)

    scheduler = _shared([PullWorker(runner, here=True), PullWorker(runner, here=True)])
    scheduler.start()

    def submit_many(first: int) -> None:
        for i in range(first, first + 100):
            scheduler.submit(_job(i))

    submitters = [threading.Thread(target=submit_many, args=(k * 100,)) for k in range(4)]
    for submitter in submitters:
        submitter.start()
    for submitter in submitters:
        submitter.join(30)
    assert _wait_until(lambda: len(done) == 400)
    scheduler.stop()
    assert sorted(done, key=int) == [str(i) for i in range(400)]  # each once
    assert running[1] == 2  # both instances were used, never a third job at once


def test_shared_queue_stop_waits_for_a_job_running_on_its_submitters_thread():
    release = threading.Event()
    ran: list[str] = []

    entered = threading.Event()

    def runner(jobs: list[Job]) -> None:
        entered.set()
        release.wait(10)
        ran.append(jobs[0].request.id)

    scheduler = _shared([PullWorker(runner, here=True)])
    scheduler.start()
    submitter = threading.Thread(target=scheduler.submit, args=(_job(0),))
    submitter.start()
    stopper = threading.Thread(target=scheduler.stop)
    assert entered.wait(10)
    stopper.start()
    time.sleep(0.05)
    assert stopper.is_alive()  # still executing: stop waits for it
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and ran == ["0"]
    with pytest.raises(Unavailable):
        scheduler.submit(_job(1))
