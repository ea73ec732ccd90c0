"""Triton's default scheduler: each request runs alone, in arrival order, on an instance with room.

A request starts at once from the thread that submits it when an instance has room (fewer than
its depth of batches); otherwise it waits in one FIFO queue until an instance executes a batch
or reports room again, which starts it from that thread. No thread of its own, no hand-off.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from naiad.scheduling.base import Drop, Job, Plan, PumpedScheduler, Worker
from naiad.scheduling.timers import Timers


class DefaultScheduler(PumpedScheduler):
    def __init__(self, workers: Sequence[Worker], drop: Drop, timers: Timers, name: str = "model") -> None:
        super().__init__(workers, drop, timers, name)
        self._queue: collections.deque[Job] = collections.deque()

    def submit(self, job: Job) -> None:
        with self._lock:
            self._queue.append(job)
        self._pump()

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
