"""Triton's dynamic batcher: requests queue by priority and an idle instance takes the next batch.

A batch forms when an instance is idle (it holds no batch: a request stays queued, under the
queue policy, until the batch holding it starts executing), by Triton's rule (SPEC §3
ModelDynamicBatching):

* walk the queue in priority order (level 1 first, then 2, …; requests whose timeout passed with
  timeout_action DELAY come after all others), accumulating requests whose non-batch shapes
  match the first one, while the sum of their batch sizes stays within max_batch_size;
* if that sum reached max_batch_size or the largest preferred size, send it now; else if it
  passed through a preferred size, send the batch up to the largest such point; else if the
  oldest request has waited less than max_queue_delay, wait for more (a timer looks again when
  the delay ends); else send what there is.

There is no dispatcher thread. Instances that run on threads of their own (the framework
backends) pull: an idle instance's thread forms its next batch itself, when it is ready to run
it, from everything queued until that moment (late binding: a batch formed earlier, on another
thread, would leave behind the requests that arrive while the instance's thread wakes up).
Other instances (model processes, the LLM engine, rate-limited ones) are driven by the pump (see
base.PumpedScheduler): a submit, an instance that finished a batch, or the delay's timer forms
the batch from its own thread. Either way the pump rejects or delays jobs whose timeout passed
while every instance is busy.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from naiad.errors import Unavailable
from naiad.scheduling.base import Drop, Job, Plan, PullingWorker, PumpedScheduler, Worker
from naiad.scheduling.ordering import InOrder
from naiad.scheduling.timers import Timers

TIMEOUT_REJECT = 0
TIMEOUT_DELAY = 1
_DELAYED = -1  # the priority of a job that timed out under DELAY: it runs after all others


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """ModelQueuePolicy: times in nanoseconds, 0 = none."""

    timeout_action: int = TIMEOUT_REJECT
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class BatcherSettings:
    """ModelDynamicBatching as the batcher needs it (built by the core from the model config)."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    level_policies: dict[int, QueuePolicy] = field(default_factory=dict)

    def policy(self, level: int) -> QueuePolicy:
        return self.level_policies.get(level, self.default_policy)

    def level(self, requested: int) -> int:
        """The queue a request goes to: its `priority` when valid, else the default level."""
        if self.priority_levels and 1 <= requested <= self.priority_levels:
            return requested
        return self.default_priority_level if self.priority_levels else 0


class DynamicBatcher(PumpedScheduler):
    def __init__(self, workers: Sequence[Worker], settings: BatcherSettings, drop: Drop, timers: Timers,
                 name: str = "model", pullers: Sequence[PullingWorker] = ()) -> None:
        """`pullers`: the same workers, when every one of them can pull (see the module docstring)."""
        super().__init__(workers, drop, timers, name, depth_limit=1)
        self._pullers = pullers
        self._serving = 0  # pulling threads that have not stopped
        self._changed = threading.Condition(self._lock)  # a job queued, or stopping: pullers look again
        self._settings = settings
        levels = range(1, settings.priority_levels + 1) if settings.priority_levels else [0]
        self._queues: dict[int, collections.deque[Job]] = {level: collections.deque() for level in levels}
        self._levels = sorted(self._queues)
        self._delayed: collections.deque[Job] = collections.deque()  # timed out under DELAY
        # every queue in the order batches take from them: levels 1, 2, …, then the delayed
        self._ordered_queues = (*(self._queues[level] for level in self._levels), self._delayed)
        self._clean_at = -1  # Job.cancellations when the queues were last found free of cancelled jobs
        self._deadlines = 0  # queued jobs with a deadline: only then is the queue scanned for them
        self._ordering = InOrder() if settings.preserve_ordering else None

    # -- Scheduler -----------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job at its priority level; Unavailable when that level's queue is full."""
        job.priority = self._settings.level(job.priority)
        policy = self._settings.policy(job.priority)
        job.deadline_ns = _deadline(job, policy)
        with self._lock:
            queue = self._queues[job.priority]
            if policy.max_queue_size and len(queue) >= policy.max_queue_size:
                raise Unavailable("Exceeds maximum queue size")
            if self._ordering is not None:
                job.sink = self._ordering.stamp(job.sink)  # only jobs that will be answered take a turn
            if job.deadline_ns:
                self._deadlines += 1
            if job.cancelled:
                self._clean_at = -1  # cancelled before it came: no count will tell the next scan
            queue.append(job)
            if self._pullers:
                self._changed.notify()
                if not job.deadline_ns:
                    return  # an idle puller takes it; the pump is only needed for timeouts
        self._pump()

    def start(self) -> None:
        with self._lock:
            self._serving = len(self._pullers)
        super().start()
        for worker in self._pullers:
            worker.pull(self._next_batch)

    def stop(self, wait: bool = True) -> None:
        with self._lock:
            self._stopping = True  # pullers send what is queued without delay, then stop
            self._changed.notify_all()
        super().stop(wait)

    def pending(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values()) + len(self._delayed)

    # -- PumpedScheduler -----------------------------------------------------------------------

    def _quiet(self) -> bool:
        return super()._quiet() and not self._serving

    def _plan(self, now: int) -> Plan:
        plan = Plan()
        wake = self._expire(now, plan.drops) if self._deadlines or self._any_cancelled() else 0
        for index in () if self._pullers else self._free_workers():  # pullers form their own batches
            if not self._has_jobs():
                break
            count, wait_ns = self._form(now)
            if not count:
                wake = min(wake, now + wait_ns) if wake else now + wait_ns
                break
            plan.starts.append((index, self._take(count)))
        plan.wake_ns = wake
        self._skip_turns(plan.drops)
        return plan

    def _skip_turns(self, drops: list[tuple[Job, Exception | None]]) -> None:
        if self._ordering is not None:
            for job, error in drops:
                if error is None:
                    self._ordering.skip(job.sink)  # no answer will come: later ones must not wait for it

    # -- pulling instances ---------------------------------------------------------------------

    def _next_batch(self) -> list[Job] | None:
        """An idle pulling instance's thread: block until a batch is due and take it; None once
        stopping with nothing left."""
        while True:
            drops: list[tuple[Job, Exception | None]] = []
            with self._lock:
                jobs = self._due(drops)
                self._skip_turns(drops)
            for job, error in drops:  # answered outside the lock
                self._drop(job, error)
            if jobs is None or jobs:
                return jobs

    def _due(self, drops: list[tuple[Job, Exception | None]]) -> list[Job] | None:
        """Under the lock: the batch due now (waiting for it), [] after taking out jobs to drop,
        None when stopping with nothing queued."""
        while True:
            now = time.monotonic_ns()
            if self._deadlines or self._any_cancelled():
                self._expire(now, drops)
                if drops:
                    return []
            if not self._has_jobs():
                if self._stopping:
                    self._serving -= 1
                    self._idle.notify_all()
                    return None
                self._changed.wait()
                continue
            count, wait_ns = self._form(now)
            if count:
                return self._take(count)
            self._changed.wait(wait_ns / 1e9)

    def _requeue(self, jobs: list[Job]) -> None:
        self._clean_at = -1  # a job may have been cancelled while out of the queues, unseen by a scan
        for job in reversed(jobs):
            if job.deadline_ns:
                self._deadlines += 1
            (self._delayed if job.priority == _DELAYED else self._queues[job.priority]).appendleft(job)

    # -- forming batches (under the lock) ------------------------------------------------------

    def _has_jobs(self) -> bool:
        return bool(self._delayed) or any(self._queues.values())

    def _in_order(self) -> Iterator[Job]:
        return itertools.chain(*self._ordered_queues)

    def _form(self, now: int) -> tuple[int, int]:
        """(number of jobs to run now, 0) or (0, ns to wait before looking again)."""
        settings = self._settings
        jobs = self._in_order()
        first = next(jobs)
        total, count, preferred_count, blocked = first.batch_size, 1, 0, False
        if total in settings.preferred_batch_sizes:
            preferred_count = 1
        for job in jobs:
            if job.shape_key != first.shape_key or total + job.batch_size > settings.max_batch_size:
                blocked = True  # the batch cannot grow past this job
                break
            total += job.batch_size
            count += 1
            if total in settings.preferred_batch_sizes:
                preferred_count = count
        if preferred_count:
            return preferred_count, 0
        largest_preferred = max(settings.preferred_batch_sizes, default=settings.max_batch_size)
        if blocked or total >= min(settings.max_batch_size, largest_preferred) or self._stopping:
            return count, 0
        waited = now - first.enqueued_ns
        if waited >= settings.max_queue_delay_ns:
            return count, 0
        return 0, settings.max_queue_delay_ns - waited

    def _take(self, count: int) -> list[Job]:
        """Pop the first `count` jobs in queue order (a batch is always such a prefix)."""
        batch: list[Job] = []
        for queue in self._ordered_queues:
            while queue and len(batch) < count:
                job = queue.popleft()
                if job.deadline_ns:
                    self._deadlines -= 1
                batch.append(job)
        return batch

    def _any_cancelled(self) -> bool:
        """Whether a queued job was cancelled; the queues are scanned only when some job anywhere
        was cancelled since they were last found clean (the pump asks on every turn)."""
        cancellations = Job.cancellations  # read before the scan: a cancel during it counts later
        if cancellations == self._clean_at:
            return False
        if any(job.cancelled for job in self._in_order()):
            return True
        self._clean_at = cancellations
        return False

    def _expire(self, now: int, dropped: list[tuple[Job, Exception | None]]) -> int:
        """Remove cancelled jobs; jobs past their deadline are rejected or delayed per policy.
        Returns the earliest deadline still ahead (0: none)."""
        earliest = 0
        for level, queue in self._queues.items():
            delay = self._settings.policy(level).timeout_action == TIMEOUT_DELAY
            kept = []
            for job in queue:
                if job.cancelled:
                    dropped.append((job, None))
                elif job.deadline_ns and job.deadline_ns <= now:
                    if delay:
                        job.deadline_ns, job.priority = 0, _DELAYED
                        self._delayed.append(job)
                    else:
                        dropped.append((job, Unavailable("Request timeout expired")))
                else:
                    if job.deadline_ns and (not earliest or job.deadline_ns < earliest):
                        earliest = job.deadline_ns
                    kept.append(job)
            if len(kept) != len(queue):
                queue.clear()
                queue.extend(kept)
        if any(job.cancelled for job in self._delayed):
            dropped.extend((job, None) for job in self._delayed if job.cancelled)
            kept = [job for job in self._delayed if not job.cancelled]
            self._delayed.clear()
            self._delayed.extend(kept)
        self._deadlines = sum(1 for queue in self._queues.values() for job in queue if job.deadline_ns)
        return earliest


def _deadline(job: Job, policy: QueuePolicy) -> int:
    """The policy's default timeout; a request's own `timeout` may only shorten it, and only
    when the policy allows overrides (otherwise it is ignored)."""
    default = job.enqueued_ns + policy.default_timeout_ns if policy.default_timeout_ns else 0
    if not (job.deadline_ns and policy.allow_timeout_override):
        return default
    return min(job.deadline_ns, default) if default else job.deadline_ns
