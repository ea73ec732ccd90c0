"""Runs batches of jobs on one backend instance and delivers every response."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from naiad.backends.base import Batch, ModelInstance, RaggedLayout
from naiad.core.responses import ResponseBuilder
from naiad.errors import InternalError, NaiadError
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import InferResponse

log = logging.getLogger(__name__)


class InstanceRunner:
    """Called from the instance's own thread; never raises, every job gets exactly one response."""

    def __init__(self, instance: ModelInstance, builder: ResponseBuilder, stats: ModelStatistics,
                 batched: bool, on_done: Callable[[int], None], layout: RaggedLayout | None = None) -> None:
        self.instance = instance
        self.layout = layout
        self.builder = builder
        self.stats = stats
        self.batched = batched
        self.on_done = on_done  # releases the in-flight slots of finished jobs

    def __call__(self, jobs: list[Job]) -> None:
        start = time.monotonic_ns()
        batch = self._batch(jobs)
        if (len(jobs) > 1 or self.layout is not None) and self.instance.gathers_inputs:
            batch.inputs()  # concatenation is compute_input, not the backend's infer time
        input_end = time.monotonic_ns()
        results = self._execute(batch)
        infer_end = time.monotonic_ns()
        responses = [self._response(job, result) for job, result in zip(jobs, results, strict=True)]
        end = time.monotonic_ns()
        compute = (input_end - start, infer_end - input_end, end - infer_end)
        self.stats.record_execution(batch.size, *compute)
        for job, response in zip(jobs, responses, strict=True):
            ok = response.error is None
            self.stats.record_request(ok, end - job.enqueued_ns, start - job.enqueued_ns, compute)
        self.on_done(len(jobs))
        for job, response in zip(jobs, responses, strict=True):
            job.sink(response)

    def _batch(self, jobs: list[Job]) -> Batch:
        return Batch([job.request for job in jobs], self.batched, self.layout, lambda i: jobs[i].cancelled)

    def _execute(self, batch: Batch) -> list[object]:
        try:
            results = self.instance.execute(batch)
        except Exception as error:  # the instance failed: every request in the batch fails
            log.exception("model '%s' failed to execute", self.builder.model_name)
            return [_internal(error)] * len(batch.requests)
        if len(results) != len(batch.requests):
            expected = len(batch.requests)
            message = f"model '{self.builder.model_name}' returned {len(results)} results for {expected} requests"
            return [InternalError(message)] * len(batch.requests)
        return list(results)

    def _response(self, job: Job, result: object) -> InferResponse:
        if isinstance(result, Exception):
            return self.builder.error(job.request, _internal(result))
        try:
            return self.builder.build(job.request, result)  # type: ignore[arg-type]
        except NaiadError as error:
            return self.builder.error(job.request, error)


def _internal(error: Exception) -> NaiadError:
    return error if isinstance(error, NaiadError) else InternalError(str(error) or type(error).__name__)


class DecoupledRunner(InstanceRunner):
    """Runs decoupled models: responses go to each job's sink as the backend sends them."""

    def __call__(self, jobs: list[Job]) -> None:
        start = time.monotonic_ns()
        batch = self._batch(jobs)
        open_jobs = set(range(len(jobs)))
        lock = threading.Lock()  # instances that answer later send from their own threads

        def send(index: int, result: object, final: bool) -> None:
            with lock:
                if index not in open_jobs:
                    raise InternalError(f"response sent for request {index} after its final response")
                if final:
                    open_jobs.discard(index)
            job = jobs[index]
            if result is None:
                response = InferResponse(self.builder.model_name, self.builder.version, job.request.id)
            else:
                response = self._response(job, result)
            response.final = final
            if final:
                now = time.monotonic_ns()
                self.stats.record_request(response.error is None, now - job.enqueued_ns,
                                          start - job.enqueued_ns, (0, now - start, 0))
                self.on_done(1)
            job.sink(response)

        error: Exception | None = None
        try:
            self.instance.execute_decoupled(batch, send)
        except Exception as raised:  # the instance failed: every open request fails
            log.exception("model '%s' failed to execute", self.builder.model_name)
            error = _internal(raised)
        self.stats.record_execution(batch.size, 0, time.monotonic_ns() - start, 0)
        if self.instance.answers_later and error is None:
            return  # the instance answers the open requests itself, later
        with lock:
            remaining = sorted(open_jobs)
        for index in remaining:
            with contextlib.suppress(InternalError):  # answered by the instance's own thread meanwhile
                send(index, error, True)
