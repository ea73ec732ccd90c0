"""Runs batches of jobs on one backend instance and delivers every response."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from naiad.backends.base import Batch, ModelInstance
from naiad.core.responses import ResponseBuilder
from naiad.errors import InternalError, NaiadError
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import InferResponse

log = logging.getLogger(__name__)


class InstanceRunner:
    """Called from the instance's own thread; never raises, every job gets exactly one response."""

    def __init__(self, instance: ModelInstance, builder: ResponseBuilder, stats: ModelStatistics,
                 batched: bool, on_done: Callable[[int], None]) -> None:
        self.instance = instance
        self.builder = builder
        self.stats = stats
        self.batched = batched
        self.on_done = on_done  # releases the in-flight slots of finished jobs

    def __call__(self, jobs: list[Job]) -> None:
        start = time.monotonic_ns()
        batch = Batch([job.request for job in jobs], self.batched)
        results = self._execute(batch)
        infer_end = time.monotonic_ns()
        responses = [self._response(job, result) for job, result in zip(jobs, results, strict=True)]
        end = time.monotonic_ns()
        compute = (0, infer_end - start, end - infer_end)
        self.stats.record_execution(batch.size, *compute)
        for job, response in zip(jobs, responses, strict=True):
            ok = response.error is None
            self.stats.record_request(ok, end - job.enqueued_ns, start - job.enqueued_ns, compute)
        self.on_done(len(jobs))
        for job, response in zip(jobs, responses, strict=True):
            job.sink(response)

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
