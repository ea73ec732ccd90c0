"""The instance contract on a thread, for backends whose `execute(batch)` blocks.

Framework backends (onnxruntime, torch, tensorflow, openvino, tensorrt, identity, repeat) write
one synchronous method; `ThreadedInstance` turns it into the non-blocking `submit`: each instance
has one thread that runs its batches one after the other. `submit` queues the batch and wakes the
thread (the only hand-off per batch); `serve` has the thread take its batches from a queue the
model's instances share instead; the thread times the phases (gathering the inputs into one
array per tensor is compute_input, `execute` is compute_infer except for its final Batch.split of
the outputs per request, which is compute_output), reports `executed`, then sends each request's
result. A scheduler that
planned the next batch meanwhile finds the thread still running: it takes it without sleeping.

An instance whose framework lets `execute` run on any thread (`runs_anywhere`) also runs a batch
on the thread that submits it (`execute_here`: the event loop, for a request off the network)
when it is idle and its executions have lately cost less than `QUICK_NS` of CPU: the hand-off to
its thread and of the answer back costs about as much as such an execution (some 80 CPU-us on a
2-core Ice Lake VM), while a longer one would stall every other connection the loop serves.
Either way one batch at a time runs on the instance: whichever thread executes holds its lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence

from naiad.backends.base import (
    Batch,
    BatchSender,
    ExecutionTimes,
    ModelInstance,
    Outputs,
    RequestResult,
    Take,
    TakeOne,
)
from naiad.errors import InternalError, NaiadError, Unavailable

log = logging.getLogger(__name__)

#: send(request index in the batch, outputs / error / None for a flags-only response, final)
Send = Callable[[int, Outputs | Exception | None, bool], None]

#: The most CPU time (ns, gathering and splitting included) an instance's recent executions may
#: have cost for `execute_here` to run one on the submitting thread. Measured on a 2-core Ice Lake
#: VM (docs/benchmarks.md, 2026-12-06): the identity model's executions cost its thread 50-75 us
#: (6 us in a hot loop: the rest is cold caches) and ran faster inline at every concurrency; an
#: MLP's cost 120-300 us and were faster inline at 1 client but slower at 8 (the loop stopped
#: overlapping the parse of other requests with executions). Between the two, and a bound on how
#: long one request may keep the loop from every other connection.
QUICK_NS = 100_000


class ThreadedInstance(ModelInstance):
    """Subclasses implement `execute` (and, when `decoupled`, `execute_decoupled`); `execute` is
    called one batch at a time, from the instance's own thread unless `runs_anywhere`."""

    #: answer through `execute_decoupled` (any number of responses per request) instead of `execute`
    decoupled: bool = False
    #: name of the instance's thread (subclasses may set it in their __init__)
    thread_name: str = "instance"

    #: whether `execute` may run on a thread other than the instance's own (still one batch at a
    #: time), so `execute_here` may run batches: set where the framework allows it and `execute`
    #: does all its work on the calling thread, busy (no sleeps, no waits for a device or a pool
    #: of threads), so that the CPU time it costs that thread is how long it keeps the caller
    runs_anywhere: bool = False
    #: the most CPU time (ns) recent executions may have cost for `execute_here` to run one
    quick_ns: int = QUICK_NS

    _thread: threading.Thread | None = None
    _executing: threading.Lock  # held by whichever thread runs a batch on the instance
    #: the CPU time executions have cost lately (ns), timed for instances that run anywhere; -1
    #: until one was timed. Each execution moves it a quarter of the way up or an eighth of the
    #: way down: a model turned slow leaves the caller's thread after an execution or two, and
    #: one outlier (a page fault, a garbage collection) does not send the next few quick ones
    #: to the instance's thread (with "up at once", 8 % of the identity's went there). CPU time,
    #: not wall time: on the instance's own thread an execution also waits for the GIL whenever
    #: another thread holds it (the event loop, busy with other requests), which would make a
    #: quick model look slow exactly under load
    _recent_ns: int = -1
    # C-implemented, so a batch's hand-off is one put and one get: a Condition around a deque
    # cost a Python-level lock allocation and notify per batch on the hot path
    # batches, a `serve` source (the thread then takes its batches from it until it ends), or the end
    _work: queue.SimpleQueue[tuple[Batch, BatchSender] | Take | None]
    _closing: bool = False
    pulls = True

    @abstractmethod
    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        """Run the batch; return one result per request, in order: a dict of output arrays, or
        an exception for that request alone. Raising means the instance itself failed: every
        request in the batch fails."""

    def execute_decoupled(self, batch: Batch, send: Send) -> None:
        """Decoupled models answer through `send`: any number of responses per request, the last
        one with final=True. A request left without its final response when this returns is
        closed with an empty final response."""
        raise NotImplementedError(f"{type(self).__name__} does not support decoupled models")

    # -- ModelInstance -------------------------------------------------------------------------

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        if self._thread is None:
            self._start_thread()
        if self._closing:
            return False
        self._work.put((batch, sender))
        return True

    def serve(self, take: Take) -> None:
        if self._thread is None:
            self._start_thread()
        self._work.put(take)

    def execute_here(self, take: TakeOne) -> bool:
        recent = self._recent_ns
        if not self.runs_anywhere or self.decoupled or self._closing or not 0 <= recent <= self.quick_ns:
            return False
        if self._thread is None or not self._executing.acquire(blocking=False):
            return False  # not started yet, or its thread (or another caller) is executing
        try:
            self._run(*take())
        finally:
            self._executing.release()
        return True

    def close(self) -> None:
        thread = self._thread
        if thread is None or self._closing:
            return
        self._closing = True
        self._work.put(None)  # after the batches already queued: they run first
        if thread is not threading.current_thread():
            thread.join()

    def _start_thread(self) -> None:
        # Lazily, so subclasses need not call an __init__ of this class.
        self._work = queue.SimpleQueue()
        self._executing = threading.Lock()
        thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread = thread
        thread.start()

    # -- the instance's thread -----------------------------------------------------------------

    def _loop(self) -> None:
        get, executing = self._work.get, self._executing
        while (item := get()) is not None:
            if isinstance(item, tuple):
                with executing:
                    self._execute_one(*item)
            else:  # serve: take batches from the scheduler's queue until it says stop
                while (taken := item()) is not None:
                    with executing:
                        self._execute_one(*taken)
        # A submit that raced close() put its batch behind the end mark: answer it, never drop it.
        while True:
            try:
                late = self._work.get_nowait()
            except queue.Empty:
                return
            if isinstance(late, tuple):  # (a serve that came after close has nothing to answer)
                batch, sender = late
                now = time.monotonic_ns()
                sender.executed(ExecutionTimes(now, now, now, now))
                for index in range(len(batch.requests)):
                    sender.send(index, Unavailable(f"{self.thread_name} was closed"), True)

    def _execute_one(self, batch: Batch, sender: BatchSender) -> None:
        if self.decoupled:
            self._run_decoupled(batch, sender)
        else:
            self._run(batch, sender)

    def _run(self, batch: Batch, sender: BatchSender) -> None:
        timed = self.runs_anywhere
        cpu_start = time.thread_time_ns() if timed else 0
        start = time.monotonic_ns()
        batch.inputs()  # gathering (concatenating) the inputs is compute_input
        input_end = time.monotonic_ns()
        try:
            results = self.execute(batch)
            if len(results) != len(batch.requests):
                raise InternalError(f"returned {len(results)} results for {len(batch.requests)} requests")
        except Exception as error:  # the instance failed: every request in the batch fails
            log.exception("%s failed to execute", self.thread_name)
            results = [_internal(error)] * len(batch.requests)
        end = time.monotonic_ns()
        if timed:
            took, recent = time.thread_time_ns() - cpu_start, self._recent_ns
            if recent < 0:
                self._recent_ns = took
            elif took > recent:
                self._recent_ns = recent + (took - recent) // 4
            else:
                self._recent_ns = recent - (recent - took) // 8
        # execute ends by splitting its outputs per request (Batch.split): that is compute_output
        sender.executed(ExecutionTimes(start, input_end, end - batch.split_ns, end))
        for index, result in enumerate(results):
            sender.send(index, result, True)

    def _run_decoupled(self, batch: Batch, sender: BatchSender) -> None:
        start = time.monotonic_ns()
        error: Exception | None = None
        try:
            self.execute_decoupled(batch, sender.send)
        except Exception as raised:  # the instance failed: every open request fails
            log.exception("%s failed to execute", self.thread_name)
            error = _internal(raised)
        end = time.monotonic_ns()
        sender.executed(ExecutionTimes(start, start, end, end))
        sender.close_open(error)


def _internal(error: Exception) -> NaiadError:
    return error if isinstance(error, NaiadError) else InternalError(str(error) or type(error).__name__)
