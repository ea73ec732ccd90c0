"""The core's side of the instance contract: how one model version answers the batches it runs.

`Responder` is made once per loaded version: it turns results into responses (the version's
ResponseBuilder), records statistics and releases in-flight slots. `BatchDelivery` is the
`BatchSender` of one batch: the instance reports `executed` (the batch's statistics, then the
scheduler may plan the next batch) and `send`s each request's responses, which are counted and
handed to each job's sink. Statistics are always recorded before the response reaches its sink,
so a client that reads the statistics right after its answer finds its request counted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from naiad.backends.base import BatchSender, ExecutionTimes, Outputs
from naiad.core.responses import ResponseBuilder
from naiad.errors import Cancelled, InternalError, NaiadError
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import InferResponse


class Responder:
    """One model version's way of answering (built once at load time)."""

    __slots__ = ("builder", "failure_reason", "lock", "release", "stats")

    def __init__(self, builder: ResponseBuilder, stats: ModelStatistics, release: Callable[[int], None],
                 failure_reason: str) -> None:
        self.builder = builder
        self.stats = stats
        self.release = release  # gives back in-flight slots (unload waits for them)
        self.failure_reason = failure_reason  # nv_inference_request_failure's reason for a failed run
        self.lock = threading.Lock()  # final responses of decoupled batches may race

    def response(self, job: Job, result: Outputs | Exception | None) -> InferResponse:
        builder = self.builder
        request = job.request
        if result is None:  # a flags-only response (decoupled)
            return InferResponse(builder.model_name, builder.version, request.id)
        if isinstance(result, Exception):
            return builder.error(request, as_naiad_error(result))
        try:
            return builder.build(request, result)
        except NaiadError as error:
            return builder.error(request, error)

    def reason(self, error: Exception | None) -> str:
        return "CANCELED" if isinstance(error, Cancelled) else self.failure_reason


class BatchDelivery(BatchSender):
    """The sender of one batch: see the module docstring."""

    __slots__ = ("finished", "jobs", "on_executed", "responded", "responder", "submitted_ns", "times")

    def __init__(self, responder: Responder, jobs: list[Job], on_executed: Callable[[], None]) -> None:
        self.responder = responder
        self.jobs = jobs
        self.on_executed = on_executed
        self.submitted_ns = time.monotonic_ns()
        self.times: ExecutionTimes | None = None
        self.finished = [False] * len(jobs)
        # requests answered at least once (the first-response histogram), when that is on
        self.responded: list[bool] | None = [False] * len(jobs) if responder.stats.first_response else None

    def is_cancelled(self, index: int) -> bool:
        """Whether nobody waits for request `index` any more (Batch.is_cancelled)."""
        return self.jobs[index].cancelled

    # -- BatchSender ---------------------------------------------------------------------------

    def executed(self, times: ExecutionTimes) -> None:
        self.times = times
        start, input_end, infer_end, end = times
        jobs = self.jobs
        size = jobs[0].batch_size if len(jobs) == 1 else sum(job.batch_size for job in jobs)
        self.responder.stats.record_execution(size, input_end - start, infer_end - input_end, end - infer_end)
        for job in self.jobs:
            if job.trace is not None:
                job.trace.timestamps.extend((("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                                             ("COMPUTE_OUTPUT_START", infer_end), ("COMPUTE_END", end)))
        self.on_executed()

    def send(self, index: int, result: Outputs | Exception | None, final: bool) -> None:
        responder = self.responder
        if final:
            with responder.lock:
                if self.finished[index]:
                    raise InternalError(f"response sent for request {index} after its final response")
                self.finished[index] = True
        elif self.finished[index]:
            raise InternalError(f"response sent for request {index} after its final response")
        job = self.jobs[index]
        stats = responder.stats
        responded = self.responded
        if responded is not None and not responded[index]:
            responded[index] = True
            stats.record_first_response(time.monotonic_ns() - job.enqueued_ns)
        response = responder.response(job, result)
        response.final = final
        if final:
            now = time.monotonic_ns()
            times = self.times
            if times is not None:
                start, input_end, infer_end, end = times
                compute = (input_end - start, infer_end - input_end, end - infer_end)
            else:  # answered before the model reported its execution (decoupled): what we know
                start, compute = self.submitted_ns, (0, now - self.submitted_ns, 0)
            error = response.error
            stats.record_request(error is None, now - job.enqueued_ns, start - job.enqueued_ns, compute,
                                 "" if error is None else responder.reason(error))  # (no reason: a success)
            responder.release(1)
        job.sink(response)

    def close_open(self, error: Exception | None) -> None:
        for index in range(len(self.jobs)):
            if not self.finished[index]:
                with contextlib.suppress(InternalError):  # answered by the instance's thread meanwhile
                    self.send(index, error, True)


def as_naiad_error(error: Exception) -> NaiadError:
    return error if isinstance(error, NaiadError) else InternalError(str(error) or type(error).__name__)
