"""The scheduler contract.

A scheduler decides which requests execute together and on which model instance. It owns every
request from `submit` until the batch holding it starts executing: that is what "queued" means
(Triton's rule), so queue sizes, timeouts, priorities and ordering apply on every backend.

It drives each instance through a `Worker` the core makes: `run(jobs, executed)` hands a batch
over without blocking and says whether the instance took it; the worker calls `executed` once
the instance is done executing that batch (its answers may still come later, for decoupled
models). A scheduler therefore needs no thread per instance: it starts batches from whichever
thread notices that one may start (a submit, an executed batch, an instance with room again, a
timer). `PumpedScheduler` holds that machinery; the strategies only say what may start now.

Invariants every scheduler keeps:
* `submit` never blocks on execution; it raises NaiadError (e.g. Unavailable for a full queue)
  only for a job it did not take.
* every job taken is either run, or handed back through `Drop` exactly once (timed out,
  cancelled, or left over at stop); a job is never both.
* a worker is never given a batch while it holds `depth` batches (batching schedulers give
  each instance one at a time, so the next batch forms from what queued meanwhile).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from naiad.observability.tracing import Trace
from naiad.scheduling.timers import TimerHandle, Timers
from naiad.types import InferRequest, InferResponse

log = logging.getLogger(__name__)
STOP_WAIT_S = 60.0  # how long stop(wait=True) waits for instances to execute what they hold


class ResponseSink(Protocol):
    """Where the responses of one request go (final last); called from any thread."""

    def __call__(self, response: InferResponse) -> None: ...



@dataclass(slots=True)
class Job:
    """A request waiting for execution, with where its response goes and when it arrived.

    The batching fields are filled by the core when the job is made: `batch_size` (the leading
    dimension for batching models, else 1), `shape_key` (requests batch together only when their
    keys are equal), `priority` (the requested level, 0 = default), `deadline_ns` (monotonic,
    0 = none). `cancel()` sets `cancelled` when nobody waits for the answer any more; `trace` is
    stamped along the way when the request is traced.
    """

    request: InferRequest
    sink: ResponseSink
    enqueued_ns: int = field(default_factory=time.monotonic_ns)
    batch_size: int = 1
    shape_key: tuple[object, ...] = ()
    priority: int = 0
    deadline_ns: int = 0
    cancelled: bool = False
    trace: Trace | None = None  # set when the request was sampled for tracing
    #: Jobs cancelled so far, all schedulers together: a queue scanned clean need not be scanned
    #: for cancelled jobs again until this changes (a count that lost an update to a race still
    #: changed, which is all that matters).
    cancellations: ClassVar[int] = 0

    def cancel(self) -> None:
        """Nobody waits for the answer any more: a queued job leaves its queue unanswered."""
        self.cancelled = True  # before the count, which a scanner reads before it scans
        Job.cancellations += 1


#: How a scheduler hands back a job it will not run (timed out, cancelled, stopping): the core
#: answers it with the error, if any, and releases its in-flight slot.
Drop = Callable[[Job, Exception | None], None]


class Worker(Protocol):
    """One model instance as a scheduler drives it (made by the core)."""

    #: batches the instance may hold at once under the default scheduler (a model process keeps
    #: a few in its pipe); batching schedulers give it one at a time whatever this says
    depth: int

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        """Start `jobs` as one batch without blocking. True: the instance took them and calls
        `executed` (from any thread, possibly before this returns) once it has executed them.
        False: it cannot take them now and took nothing; it calls the room callback when it can."""
        ...

    def set_on_room(self, callback: Callable[[], None]) -> None:
        """`callback` is called (from any thread, holding no lock) whenever the instance can
        take batches again after `run` returned False."""
        ...


class PullingWorker(Protocol):
    """A worker whose instance runs on a thread of its own, so it can fetch its own jobs."""

    def pull(self, take: Callable[[], list[Job] | None]) -> None:
        """Instead of `run`: the instance's thread runs the jobs `take()` returns (blocking until
        there are some) whenever it is idle, until `take()` returns None."""
        ...

    def run_here(self, jobs: list[Job]) -> bool:
        """Execute `jobs` as one batch on the calling thread, now, if the instance is idle and
        lets it; True once they are executed and answered, False when nothing happened."""
        ...


class Scheduler(ABC):
    @abstractmethod
    def start(self) -> None:
        """Begin starting jobs on the workers."""

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queue a job; never blocks on execution."""

    @abstractmethod
    def stop(self, wait: bool = True) -> None:
        """Start (or drop) what is queued without waiting for queue delays; with `wait`, return
        once every batch started has been executed."""

    @abstractmethod
    def pending(self) -> int:
        """Jobs queued and not yet executing."""


class Plan:
    """What one look at a scheduler's queues decided: batches to start (worker index, jobs),
    jobs to drop (with their error), and when to look again (monotonic ns; 0 = no need)."""

    __slots__ = ("drops", "rooms", "starts", "wake_ns")

    def __init__(self) -> None:
        self.starts: list[tuple[int, list[Job]]] = []
        self.drops: list[tuple[Job, Exception | None]] = []
        self.wake_ns = 0
        self.rooms: list[int] = []  # each worker's room callbacks when the plan was made


class PumpedScheduler(Scheduler):
    """A scheduler that starts batches from whichever thread has news, one thread at a time.

    Every event (a submit, a batch executed, an instance with room, a timer) calls `_pump`. The
    first caller becomes the pump: it asks `_plan` (under the lock) what may start now, then
    runs those batches and answers dropped jobs outside the lock, and repeats while more events
    arrived meanwhile; other callers only flag that something changed. So batches start in the
    order they were planned, a worker's synchronous callbacks (an instance answering inside
    `run`) never deadlock, and nothing waits on a thread hand-off.
    """

    def __init__(self, workers: Sequence[Worker], drop: Drop, timers: Timers, name: str, depth_limit: int = 0) -> None:
        """`depth_limit` caps every worker's depth (1 for batching schedulers); 0 keeps each one's."""
        self._workers = workers
        self._drop = drop
        self._timers = timers
        self._name = name
        self._lock = threading.Lock()
        # batches each worker holds, and whether it refused one and waits for its room callback
        self._held = [0] * len(workers)
        self._refused = [False] * len(workers)
        self._room_calls = [0] * len(workers)  # room callbacks so far: a refusal older than one is void
        self._depths = [max(1, min(w.depth, depth_limit) if depth_limit else w.depth) for w in workers]
        self._pumping = False
        self._again = False
        self._stopping = False
        self._running = False
        self._timer: TimerHandle | None = None
        self._timer_ns = 0
        self._idle = threading.Condition(self._lock)  # notified when a pump ends while stopping
        # what each worker calls once it executed a batch (made once: no closure per batch)
        self._executed_callbacks = [functools.partial(self._pump, index) for index in range(len(workers))]

    # -- Scheduler -----------------------------------------------------------------------------

    def start(self) -> None:
        for index, worker in enumerate(self._workers):
            worker.set_on_room(functools.partial(self._room, index))
        with self._lock:
            self._running = True
        self._pump()

    def stop(self, wait: bool = True) -> None:
        with self._lock:
            self._stopping = True
        self._pump()  # starts what may start, drops what never will
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if wait and not self._idle.wait_for(self._quiet, STOP_WAIT_S):
                log.warning("scheduler of '%s': instances still hold %d batches after %g s", self._name,
                            sum(self._held), STOP_WAIT_S)

    def _quiet(self) -> bool:
        """No pump running and every batch started was executed (under the lock)."""
        return not self._pumping and not any(self._held)

    # -- the pump ------------------------------------------------------------------------------

    def _pump(self, executed: int = -1) -> None:
        """Start what may start now; `executed` is the worker that just finished a batch, if any."""
        with self._lock:
            if executed >= 0:
                self._held[executed] -= 1
                if self._stopping:
                    self._idle.notify_all()
                if not self._pumping and not self._queued():
                    return  # the common case when load is light: nothing waits for the room
            if self._pumping or not self._running:
                self._again = True
                return
            self._pumping = True
            plan = self._take_plan()
        self._drive(plan)

    def _start_now(self, index: int, jobs: list[Job]) -> Plan:
        """Under the lock, when no pump runs: become the pump with a plan that starts `jobs` on
        worker `index` (a strategy's shortcut when it knows at submit what may start); the
        caller then passes the plan to `_drive` outside the lock."""
        self._pumping = True
        self._held[index] += 1
        plan = Plan()
        plan.starts.append((index, jobs))
        plan.rooms = self._room_calls.copy()
        return plan

    def _drive(self, plan: Plan | None) -> None:
        """The pump's loop: carry out `plan`, then the plans of whatever arrived meanwhile."""
        try:
            while plan is not None:
                for job, error in plan.drops:
                    self._drop(job, error)
                refused: list[tuple[int, list[Job]]] = []
                for index, jobs in plan.starts:  # a loop, not a comprehension: no call per plan
                    if not self._workers[index].run(jobs, self._executed_callbacks[index]):
                        refused.append((index, jobs))
                with self._lock:
                    for index, jobs in reversed(refused):
                        self._held[index] -= 1
                        # Room may have come back while the worker said no: then try it again.
                        self._refused[index] = self._room_calls[index] == plan.rooms[index]
                        self._requeue(jobs)
                    if self._again or refused:
                        plan = self._take_plan()
                    else:
                        self._end_pump()
                        plan = None
        except BaseException:
            with self._lock:
                self._end_pump()
            raise

    def _take_plan(self) -> Plan | None:
        """Under the lock: what may start now (counted as held), or None (and the pump ends)
        when there is nothing to do."""
        self._again = False
        plan = self._plan(time.monotonic_ns())
        if plan.wake_ns:
            self._arm(plan.wake_ns)
        if not plan.starts and not plan.drops:
            self._end_pump()
            return None
        for index, _ in plan.starts:
            self._held[index] += 1
        plan.rooms = self._room_calls.copy()
        return plan

    def _end_pump(self) -> None:
        self._pumping = False
        if self._stopping:
            self._idle.notify_all()

    def _room(self, index: int) -> None:
        with self._lock:
            self._refused[index] = False
            self._room_calls[index] += 1
        self._pump()

    def _arm(self, wake_ns: int) -> None:
        """Have the pump run again at `wake_ns` (under the lock); 0 leaves the timer as it is."""
        if not wake_ns or (self._timer is not None and self._timer_ns <= wake_ns):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_ns = wake_ns
        self._timer = self._timers.call_at(wake_ns, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
        self._pump()

    def _free_workers(self) -> list[int]:
        """Workers that may take a batch now (under the lock), least busy first."""
        if len(self._held) == 1:  # one instance (the common case): no comprehension
            return [0] if self._held[0] < self._depths[0] and not self._refused[0] else []
        free = [i for i, held in enumerate(self._held) if held < self._depths[i] and not self._refused[i]]
        if len(free) > 1:
            free.sort(key=self._held.__getitem__)
        return free

    # -- what strategies provide ---------------------------------------------------------------

    @abstractmethod
    def _plan(self, now: int) -> Plan:
        """Under the lock: take out what may start now (on free workers), what must be dropped,
        and when to look again."""

    def _queued(self) -> bool:
        """Under the lock: whether any job waits (False lets a finished batch skip planning)."""
        return True

    @abstractmethod
    def _requeue(self, jobs: list[Job]) -> None:
        """Under the lock: put back a batch its worker refused, ahead of everything else."""
