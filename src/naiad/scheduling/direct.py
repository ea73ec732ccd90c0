"""Triton's default scheduler (one request per execution) for instances that answer later.

Instances that run their batches elsewhere (a model process) need no thread of their own here:
a request starts on an instance with room right from the thread that submits it, and a request
that finds none waits in a FIFO queue until an instance reports room again, which starts it
from the thread that noticed (the one reading that instance's answers). No thread hand-off per
request, no runner threads at all.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Protocol

from naiad.scheduling.base import Drop, Job, Scheduler


class StartingRunner(Protocol):
    """A runner that starts jobs without blocking (see core.runner.AsyncRunner)."""

    def try_run(self, jobs: list[Job]) -> bool:
        """Start the jobs if the instance has room now; False (and nothing started) if not."""
        ...

    def set_on_room(self, callback: Callable[[], None]) -> None:
        """Have `callback` called (from any thread) whenever the instance has room again."""
        ...


def can_start(runner: object) -> bool:
    return callable(getattr(runner, "try_run", None)) and callable(getattr(runner, "set_on_room", None))


class DirectScheduler(Scheduler):
    def __init__(self, runners: list[StartingRunner], name: str = "model", drop: Drop | None = None) -> None:
        self._runners = runners
        self._name = name
        self._drop = drop
        self._queue: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()  # held while starting: jobs start in submission order
        self._next = 0  # where the round-robin over instances resumes

    def start(self) -> None:
        for runner in self._runners:
            runner.set_on_room(self._drain)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._queue or not self._start(job):
                self._queue.append(job)

    def _drain(self) -> None:
        with self._lock:
            while self._queue and self._start(self._queue[0]):
                self._queue.popleft()

    def _start(self, job: Job) -> bool:
        """Start `job` on the next instance with room (or drop it if nobody waits for it)."""
        if job.cancelled and self._drop is not None:
            self._drop(job, None)
            return True
        count = len(self._runners)
        for step in range(count):
            index = (self._next + step) % count
            if self._runners[index].try_run([job]):
                self._next = (index + 1) % count
                return True
        return False

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def stop(self, wait: bool = True) -> None:
        """Nothing to join: queued jobs still start as instances report room."""
