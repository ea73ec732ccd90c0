"""Runs batches of jobs on one backend instance and delivers every response."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from naiad.backends.base import Batch, ModelInstance, RaggedLayout
from naiad.core.responses import ResponseBuilder
from naiad.errors import Cancelled, InternalError, NaiadError
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import InferResponse


def failure_reason(error: Exception | None, instance: ModelInstance) -> str:
    """The metrics' reason for a request that executed and failed (ensembles say OTHER)."""
    return "CANCELED" if isinstance(error, Cancelled) else instance.failure_reason

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
        for job in jobs:
            if job.trace is not None:
                job.trace.timestamps.extend((("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                                             ("COMPUTE_OUTPUT_START", infer_end), ("COMPUTE_END", end)))
        for job, response in zip(jobs, responses, strict=True):
            ok = response.error is None
            self.stats.record_request(ok, end - job.enqueued_ns, start - job.enqueued_ns, compute,
                                      failure_reason(response.error, self.instance))
            if self.stats.first_response is not None:
                self.stats.record_first_response(end - job.enqueued_ns)
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


class _Delivery:
    """The jobs of one batch that still wait for their final response; `send` answers one, from
    any thread (instances that answer later send from their own)."""

    def __init__(self, runner: InstanceRunner, jobs: list[Job], start: int) -> None:
        self.runner = runner
        self.jobs = jobs
        self.start = start
        self.open = set(range(len(jobs)))
        self.unanswered = set(range(len(jobs)))  # no response sent yet (the first-response histogram)
        self.lock = threading.Lock()

    def send(self, index: int, result: object, final: bool) -> None:
        with self.lock:
            if index not in self.open:
                raise InternalError(f"response sent for request {index} after its final response")
            if final:
                self.open.discard(index)
            first = index in self.unanswered
            self.unanswered.discard(index)
        runner = self.runner
        job = self.jobs[index]
        if first and runner.stats.first_response is not None:
            runner.stats.record_first_response(time.monotonic_ns() - job.enqueued_ns)
        if result is None:
            response = InferResponse(runner.builder.model_name, runner.builder.version, job.request.id)
        else:
            response = runner._response(job, result)
        response.final = final
        if final:
            now = time.monotonic_ns()
            if job.trace is not None:
                job.trace.timestamps.extend((("COMPUTE_START", self.start), ("COMPUTE_END", now)))
            runner.stats.record_request(response.error is None, now - job.enqueued_ns,
                                        self.start - job.enqueued_ns, (0, now - self.start, 0),
                                        failure_reason(response.error, runner.instance))
            runner.on_done(1)
        job.sink(response)

    def close_open(self, error: Exception | None) -> None:
        """Answer every request still open: with `error`, or an empty final response."""
        with self.lock:
            remaining = sorted(self.open)
        for index in remaining:
            with contextlib.suppress(InternalError):  # answered by the instance's own thread meanwhile
                self.send(index, error, True)


class DecoupledRunner(InstanceRunner):
    """Runs decoupled models: responses go to each job's sink as the backend sends them."""

    def __call__(self, jobs: list[Job]) -> None:
        start = time.monotonic_ns()
        batch = self._batch(jobs)
        delivery = _Delivery(self, jobs, start)
        error: Exception | None = None
        try:
            self.instance.execute_decoupled(batch, delivery.send)
        except Exception as raised:  # the instance failed: every open request fails
            log.exception("model '%s' failed to execute", self.builder.model_name)
            error = _internal(raised)
        self.stats.record_execution(batch.size, 0, time.monotonic_ns() - start, 0)
        delivery.close_open(error)


class AsyncRunner(InstanceRunner):
    """Runs instances that answer later (`ModelInstance.answers_later`: a model process): hands
    the batch over and returns as soon as the instance took it, so this thread never waits for
    the model; responses reach each job's sink from the instance's own thread. `try_run` and
    `set_on_room` let a DirectScheduler start jobs with no thread of its own."""

    def __call__(self, jobs: list[Job]) -> None:
        self._run(jobs, blocking=True)

    def try_run(self, jobs: list[Job]) -> bool:
        return self._run(jobs, blocking=False)

    def set_on_room(self, callback: Callable[[], None]) -> None:
        self.instance.set_on_room(callback)

    def _run(self, jobs: list[Job], blocking: bool) -> bool:
        start = time.monotonic_ns()
        batch = self._batch(jobs)
        delivery = _Delivery(self, jobs, start)

        def executed() -> None:
            self.stats.record_execution(batch.size, 0, time.monotonic_ns() - start, 0)

        try:
            return self.instance.start(batch, delivery.send, executed, blocking)
        except Exception as raised:  # the instance could not take it: every request fails
            log.exception("model '%s' failed to execute", self.builder.model_name)
            delivery.close_open(_internal(raised))
            return True
