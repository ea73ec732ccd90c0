"""Triton's default scheduler: each request runs alone on the first idle instance.

All instance threads block on one shared queue, so whichever instance is idle takes the next
request: no dispatcher thread, no per-request hand-off beyond the queue itself.
"""

from __future__ import annotations

import queue
import threading

from naiad.scheduling.base import Drop, Job, Runner, Scheduler


class DefaultScheduler(Scheduler):
    def __init__(self, runners: list[Runner], name: str = "model", drop: Drop | None = None) -> None:
        self._runners = runners
        self._name = name
        self._drop = drop
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, runner in enumerate(self._runners):
            thread = threading.Thread(
                target=self._loop, args=(runner,), name=f"{self._name}-instance-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, wait: bool = True) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
        self._threads.clear()

    def _loop(self, runner: Runner) -> None:
        get = self._queue.get
        while (job := get()) is not None:
            if job.cancelled and self._drop is not None:
                self._drop(job, None)  # nobody waits for this answer any more
                continue
            runner([job])
