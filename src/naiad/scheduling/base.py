"""The scheduler contract.

A scheduler decides which requests execute together and on which instance. `submit` returns
at once; each request's response reaches its sink later, from a runner thread. Runners are
callables handed in by the core (one per model instance): a runner executes a list of jobs as
one batch and delivers every job's response itself, so a scheduler never sees outputs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from naiad.observability.tracing import Trace
from naiad.types import InferRequest, InferResponse

Sink = Callable[[InferResponse], None]


@dataclass(slots=True)
class Job:
    """A request waiting for execution, with where its response goes and when it arrived.

    The batching fields are filled by the core when the job is made: `batch_size` (the leading
    dimension for batching models, else 1), `shape_key` (requests batch together only when their
    keys are equal), `priority` (the requested level, 0 = default), `deadline_ns` (monotonic,
    0 = none). `cancelled` is set when nobody waits for the answer any more; `trace` is stamped
    along the way when the request is traced.
    """

    request: InferRequest
    sink: Sink
    enqueued_ns: int = field(default_factory=time.monotonic_ns)
    batch_size: int = 1
    shape_key: tuple[object, ...] = ()
    priority: int = 0
    deadline_ns: int = 0
    cancelled: bool = False
    trace: Trace | None = None  # set when the request was sampled for tracing


Runner = Callable[[list[Job]], None]
#: How a scheduler hands back a job it will not run (timed out, cancelled): the core answers
#: it with the error, if any, and releases its in-flight slot.
Drop = Callable[[Job, Exception | None], None]


class Scheduler(ABC):
    @abstractmethod
    def start(self) -> None:
        """Start the threads that feed the runners."""

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queue a job; never blocks on execution."""

    @abstractmethod
    def stop(self, wait: bool = True) -> None:
        """Stop after the queued jobs have run; with `wait`, return once every runner thread exited."""

    @abstractmethod
    def pending(self) -> int:
        """Jobs queued and not yet executing."""
