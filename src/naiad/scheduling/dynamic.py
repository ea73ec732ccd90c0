"""Triton's dynamic batcher: requests queue by priority and idle instances take batches.

There is no dispatcher thread. Each instance thread, when idle, takes the queue lock and forms
the next batch itself (Triton's rule, SPEC §3 ModelDynamicBatching):

* walk the queue in priority order (level 1 first, then 2, …; requests whose timeout passed with
  timeout_action DELAY come after all others), accumulating requests whose non-batch shapes
  match the first one, while the sum of their batch sizes stays within max_batch_size;
* if that sum reached max_batch_size or the largest preferred size, send it now; else if it
  passed through a preferred size, send the batch up to the largest such point; else if the
  oldest request has waited less than max_queue_delay, wait for more (or for the delay to end);
  else send what there is.

So a request costs one queue append and one notify on the way in, like the default scheduler:
the hot path gains no extra thread hop.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from naiad.errors import Unavailable
from naiad.scheduling.base import Drop, Job, Runner, Scheduler

TIMEOUT_REJECT = 0
TIMEOUT_DELAY = 1


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


class DynamicBatcher(Scheduler):
    def __init__(self, runners: list[Runner], settings: BatcherSettings, drop: Drop, name: str = "model") -> None:
        self._runners = runners
        self._settings = settings
        self._drop = drop
        self._name = name
        levels = range(1, settings.priority_levels + 1) if settings.priority_levels else [0]
        self._queues: dict[int, collections.deque[Job]] = {level: collections.deque() for level in levels}
        self._delayed: collections.deque[Job] = collections.deque()  # timed out under DELAY
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._ordering = _InOrder() if settings.preserve_ordering else None

    # -- Scheduler -----------------------------------------------------------------------------

    def start(self) -> None:
        for i, runner in enumerate(self._runners):
            thread = threading.Thread(target=self._loop, args=(runner,), name=f"{self._name}-instance-{i}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

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
                self._ordering.stamp(job)  # only jobs that will be answered take a turn
            queue.append(job)
            self._wakeup.notify()

    def pending(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values()) + len(self._delayed)

    def stop(self, wait: bool = True) -> None:
        with self._lock:
            self._stopping = True
            self._wakeup.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()
        self._threads.clear()

    # -- instance threads ----------------------------------------------------------------------

    def _loop(self, runner: Runner) -> None:
        while (batch := self._next_batch()) is not None:
            if batch:
                runner(batch)

    def _next_batch(self) -> list[Job] | None:
        """Block until a batch is due; [] after dropping jobs; None once stopping and empty."""
        dropped: list[tuple[Job, Exception | None]] = []
        try:
            with self._lock:
                while True:
                    self._expire(time.monotonic_ns(), dropped)
                    if dropped:
                        return []  # answer the dropped ones outside the lock, then come back
                    if not any(self._queues.values()) and not self._delayed:
                        if self._stopping:
                            return None
                        self._wakeup.wait()
                        continue
                    count, wait_ns = self._form()
                    if count:
                        return self._take(count)
                    self._wakeup.wait(wait_ns / 1e9)
        finally:
            for job, error in dropped:
                if error is None and self._ordering is not None:
                    self._ordering.skip(job)  # no answer will come: later ones must not wait for it
                self._drop(job, error)

    def _in_order(self) -> Iterator[Job]:
        for level in sorted(self._queues):
            yield from self._queues[level]
        yield from self._delayed

    def _form(self) -> tuple[int, int]:
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
        waited = time.monotonic_ns() - first.enqueued_ns
        if waited >= settings.max_queue_delay_ns:
            return count, 0
        return 0, settings.max_queue_delay_ns - waited

    def _take(self, count: int) -> list[Job]:
        """Pop the first `count` jobs in queue order (a batch is always such a prefix)."""
        batch: list[Job] = []
        for queue in (*(self._queues[level] for level in sorted(self._queues)), self._delayed):
            while queue and len(batch) < count:
                batch.append(queue.popleft())
        return batch

    def _expire(self, now: int, dropped: list[tuple[Job, Exception | None]]) -> None:
        """Remove cancelled jobs; jobs past their deadline are rejected or delayed per policy."""
        for level, queue in self._queues.items():
            if not any(job.cancelled or (job.deadline_ns and job.deadline_ns <= now) for job in queue):
                continue
            delay = self._settings.policy(level).timeout_action == TIMEOUT_DELAY
            kept = []
            for job in queue:
                if job.cancelled:
                    dropped.append((job, None))
                elif job.deadline_ns and job.deadline_ns <= now:
                    if delay:
                        job.deadline_ns = 0
                        self._delayed.append(job)
                    else:
                        dropped.append((job, Unavailable("Request timeout expired")))
                else:
                    kept.append(job)
            queue.clear()
            queue.extend(kept)
        if any(job.cancelled for job in self._delayed):
            dropped.extend((job, None) for job in self._delayed if job.cancelled)
            kept = [job for job in self._delayed if not job.cancelled]
            self._delayed.clear()
            self._delayed.extend(kept)


def _deadline(job: Job, policy: QueuePolicy) -> int:
    """The policy's default timeout; a request's own `timeout` may only shorten it, and only
    when the policy allows overrides (otherwise it is ignored)."""
    default = job.enqueued_ns + policy.default_timeout_ns if policy.default_timeout_ns else 0
    if not (job.deadline_ns and policy.allow_timeout_override):
        return default
    return min(job.deadline_ns, default) if default else job.deadline_ns


class _InOrder:
    """preserve_ordering: responses leave in arrival order, whichever instance finishes first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_stamp = 0
        self._next_out = 0
        self._ready: dict[int, Callable[[], None]] = {}

    def stamp(self, job: Job) -> None:
        with self._lock:
            number = self._next_stamp
            self._next_stamp += 1
        sink = job.sink

        def ordered(response: object) -> None:
            self._deliver(number, lambda: sink(response))  # type: ignore[arg-type]

        ordered.number = number  # type: ignore[attr-defined]
        job.sink = ordered  # type: ignore[assignment]

    def skip(self, job: Job) -> None:
        """A job that will never be answered gives up its turn."""
        self._deliver(job.sink.number, lambda: None)  # type: ignore[attr-defined]

    def _deliver(self, number: int, send: Callable[[], None]) -> None:
        with self._lock:
            self._ready[number] = send
            due = []
            while self._next_out in self._ready:
                due.append(self._ready.pop(self._next_out))
                self._next_out += 1
        for send_now in due:
            send_now()
