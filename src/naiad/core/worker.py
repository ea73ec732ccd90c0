"""One model instance as the schedulers drive it (scheduling.base.Worker): jobs in, a batch out.

`InstanceWorker.run` turns the jobs a scheduler chose into a `Batch` and its `BatchDelivery`,
takes the instance's rate-limiter resources (--rate-limit) if it has any, and submits the batch;
`pull` has an instance with a thread of its own take its jobs from the scheduler instead, and
`run_here` has it run a short batch on the calling thread when it is idle.
An instance that raises instead of answering fails the batch's requests; it never escapes into
the scheduler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from naiad.backends.base import Batch, ExecutionTimes, ModelInstance, RaggedLayout
from naiad.core.delivery import BatchDelivery, Responder, as_naiad_error
from naiad.scheduling.base import Job
from naiad.scheduling.rate_limiter import Needs, RateLimiter

log = logging.getLogger(__name__)


class InstanceWorker:
    def __init__(self, instance: ModelInstance, responder: Responder, batched: bool, layout: RaggedLayout | None,
                 limiter: tuple[RateLimiter, Needs] | None = None) -> None:
        self.instance = instance
        self.responder = responder
        self.batched = batched
        self.layout = layout
        self.depth = instance.depth
        self._limiter = limiter
        self._on_room: Callable[[], None] = _nothing

    @property
    def pulls(self) -> bool:
        """Whether `pull` works: the instance has a thread of its own, and no rate limiter
        needs to be asked before each batch."""
        return self.instance.pulls and self._limiter is None

    def pull(self, take: Callable[[], list[Job] | None]) -> None:
        """Have the instance's thread run the jobs `take()` returns whenever it is idle."""
        batch_of = self._batch

        def take_batch() -> tuple[Batch, BatchDelivery] | None:
            jobs = take()
            return None if jobs is None else batch_of(jobs, _nothing)

        self.instance.serve(take_batch)

    def run_here(self, jobs: list[Job]) -> bool:
        """Execute `jobs` as one batch on the calling thread if the instance is idle and lets it
        (ModelInstance.execute_here); False: nothing happened."""
        return self.instance.execute_here(lambda: self._batch(jobs, _nothing))

    def set_on_room(self, callback: Callable[[], None]) -> None:
        self._on_room = callback
        self.instance.set_on_room(callback)

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        limiter = self._limiter
        if limiter is not None:
            rate_limiter, needs = limiter
            if not rate_limiter.try_acquire(needs, self, self._on_room):
                return False
            executed = _releasing(executed, rate_limiter, needs)
        batch, delivery = self._batch(jobs, executed)
        try:
            if self.instance.submit(batch, delivery):
                return True
        except Exception as error:  # the instance could not take it: every request fails
            log.exception("model '%s' failed to execute", self.responder.builder.model_name)
            delivery.executed(ExecutionTimes.instant(time.monotonic_ns()))
            delivery.close_open(as_naiad_error(error))
            return True
        if limiter is not None:
            limiter[0].release(limiter[1])
        return False

    def _batch(self, jobs: list[Job], executed: Callable[[], None]) -> tuple[Batch, BatchDelivery]:
        """The batch of `jobs` for the instance, and the sender that answers them."""
        delivery = BatchDelivery(self.responder, jobs, executed)
        requests = [jobs[0].request] if len(jobs) == 1 else [job.request for job in jobs]
        return Batch(requests, self.batched, self.layout, delivery.is_cancelled), delivery


def _releasing(executed: Callable[[], None], limiter: RateLimiter, needs: Needs) -> Callable[[], None]:
    """`executed`, giving the rate limiter's resources back first (the instance is done with them)."""

    def release_then_report() -> None:
        limiter.release(needs)
        executed()

    return release_then_report


def _nothing() -> None:
    pass
