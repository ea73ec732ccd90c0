"""Triton's default scheduler: each request runs alone, in arrival order, on an instance with room.

Two implementations of the same rules, chosen by what the instances are:

* `SharedQueueScheduler`, for instances that run on threads of their own (the framework
  backends): requests wait in one C queue and each instance's thread takes the next one as soon
  as it is idle. Submitting is one put (under a lock only stop contends for): no planning,
  no hand-off beyond the queue. When nothing waits in the queue, an idle instance whose
  executions are short runs the request on the submitting thread instead (`run_here`): no
  hand-off at all.
* `DefaultScheduler`, for the others (model processes, the LLM engine, rate-limited instances):
  a request starts at once from the thread that submits it when an instance has room (fewer
  than its depth of batches); otherwise it waits in one FIFO queue until an instance executes a
  batch or reports room again, which starts it from that thread.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Sequence

from naiad.errors import Unavailable
from naiad.scheduling.base import STOP_WAIT_S, Drop, Job, Plan, PullingWorker, PumpedScheduler, Scheduler, Worker
from naiad.scheduling.timers import Timers

log = logging.getLogger(__name__)


class SharedQueueScheduler(Scheduler):
    """The default scheduler for workers that all `pull`."""

    def __init__(self, workers: Sequence[PullingWorker], drop: Drop, name: str = "model") -> None:
        self._workers = workers
        self._drop = drop
        self._name = name
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._serving = 0  # instance threads still taking jobs
        self._here = 0  # jobs being run on the threads that submitted them
        self._done = threading.Condition(self._lock)

    def start(self) -> None:
        with self._lock:
            self._serving = len(self._workers)
        for worker in self._workers:
            worker.pull(self._take)

    def submit(self, job: Job) -> None:
        # The lock keeps stop's end marks behind every job it accepted (uncontended but at stop).
        with self._lock:
            if self._stopped:
                raise Unavailable(f"model '{self._name}' is unloading")
            if not self._queue.empty():  # others wait: this one goes behind them
                self._queue.put(job)
                return
            self._here += 1
        try:
            ran = self._run_here([job])
        finally:
            with self._lock:
                self._here -= 1
                if self._stopped:
                    self._done.notify_all()
        if not ran:  # every instance is busy (or not quick): the job waits for their threads
            with self._lock:
                if self._stopped:  # behind stop's end marks it would never run
                    raise Unavailable(f"model '{self._name}' is unloading")
                self._queue.put(job)

    def _run_here(self, jobs: list[Job]) -> bool:
        return any(worker.run_here(jobs) for worker in self._workers)

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, wait: bool = True) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            for _ in range(self._serving):
                self._queue.put(None)  # after the jobs queued: they run first
            if wait and not self._done.wait_for(lambda: self._serving == 0 == self._here, STOP_WAIT_S):
                log.warning("scheduler of '%s': instances still busy after %g s", self._name, STOP_WAIT_S)

    def _take(self) -> list[Job] | None:
        """An idle instance's thread asks for its next job (blocking); None: stop serving."""
        get = self._queue.get
        while (job := get()) is not None:
            if job.cancelled:
                self._drop(job, None)  # nobody waits for this answer any more
                continue
            return [job]
        with self._lock:
            self._serving -= 1
            self._done.notify_all()
        return None


class DefaultScheduler(PumpedScheduler):
    def __init__(self, workers: Sequence[Worker], drop: Drop, timers: Timers, name: str = "model") -> None:
        super().__init__(workers, drop, timers, name)
        self._queue: collections.deque[Job] = collections.deque()

    def submit(self, job: Job) -> None:
        with self._lock:
            # An instance with room and nobody queued ahead: start the job here, without planning.
            free = [] if self._queue or self._pumping or not self._running else self._free_workers()
            index = free[0] if free else -1
            if index < 0:
                self._queue.append(job)
            else:
                plan = self._start_now(index, [job])
        if index < 0:
            self._pump()
        else:
            self._drive(plan)

    def _queued(self) -> bool:
        return bool(self._queue)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def _plan(self, now: int) -> Plan:
        plan = Plan()
        queue = self._queue
        if not queue:
            return plan
        if len(self._workers) == 1:  # the common case, without the spreading below
            room = 0 if self._refused[0] else self._depths[0] - self._held[0]
            while room > 0 and queue:
                job = queue.popleft()
                if job.cancelled:
                    plan.drops.append((job, None))
                    continue
                plan.starts.append((0, [job]))
                room -= 1
            return plan
        held = {index: self._held[index] for index in self._free_workers()}
        while queue and held:
            job = queue.popleft()
            if job.cancelled:
                plan.drops.append((job, None))  # nobody waits for this answer any more
                continue
            index = min(held, key=held.__getitem__)  # spread over instances: the least busy first
            plan.starts.append((index, [job]))
            held[index] += 1
            if held[index] >= self._depths[index]:
                del held[index]
        return plan

    def _requeue(self, jobs: list[Job]) -> None:
        self._queue.extendleft(reversed(jobs))
