import threading
import time

from naiad.scheduling.base import Job
from naiad.scheduling.default import DefaultScheduler
from naiad.types import InferRequest


def _job(i: int, done: list) -> Job:
    return Job(InferRequest("m", None, [], id=str(i)), done.append)


def test_every_job_runs_once_and_alone():
    ran: list[list[str]] = []
    lock = threading.Lock()

    def runner(jobs: list[Job]) -> None:
        with lock:
            ran.append([j.request.id for j in jobs])

    scheduler = DefaultScheduler([runner, runner])
    scheduler.start()
    for i in range(50):
        scheduler.submit(_job(i, []))
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

    scheduler = DefaultScheduler([slow, fast])
    scheduler.start()
    scheduler.submit(_job(0, []))
    assert busy.wait(5)  # one instance now holds the first job
    ran_first = started[0]

    other = next(r for r in ("slow", "fast") if r != ran_first)
    scheduler.submit(_job(1, []))
    deadline = time.monotonic() + 5
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == [ran_first, other]  # the idle one took it, not the busy one
    release.set()
    scheduler.stop()


def test_stop_runs_queued_jobs_first():
    ran: list[Job] = []
    scheduler = DefaultScheduler([ran.extend])
    for i in range(5):
        scheduler.submit(_job(i, []))
    assert scheduler.pending() == 5
    scheduler.start()
    scheduler.stop()
    assert len(ran) == 5 and scheduler.pending() == 0


def test_cancelled_jobs_are_dropped_not_run():
    ran: list[Job] = []
    dropped: list[tuple[Job, object]] = []
    scheduler = DefaultScheduler([ran.extend], drop=lambda job, error: dropped.append((job, error)))
    gone, kept = _job(1, []), _job(2, [])
    gone.cancelled = True
    scheduler.submit(gone)
    scheduler.submit(kept)
    scheduler.start()
    scheduler.stop()
    assert ran == [kept] and dropped == [(gone, None)]
