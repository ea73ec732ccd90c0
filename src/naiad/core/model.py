"""A loaded model version: its instances, scheduler, validator, statistics and in-flight count."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Model, ModelInstance
from naiad.backends.threaded import ThreadedInstance
from naiad.config.model_config import tensor_specs
from naiad.core.cache import ModelCache, ResponseCache, serves
from naiad.core.delivery import Responder
from naiad.core.responses import ResponseBuilder
from naiad.core.scheduling import make_job, make_scheduler, ragged_layout
from naiad.core.sequence_settings import sequence_inputs, state_output_specs
from naiad.core.validation import RequestValidator
from naiad.core.warmup import run_warmup
from naiad.core.worker import InstanceWorker
from naiad.errors import Unavailable
from naiad.observability import statistics
from naiad.observability.metrics import MetricRow
from naiad.observability.statistics import ModelStatistics
from naiad.observability.tracing import Trace
from naiad.scheduling.base import Job, ResponseSink, Scheduler
from naiad.scheduling.rate_limiter import GLOBAL_DEVICE, Needs, RateLimiter
from naiad.scheduling.timers import Timers
from naiad.types import InferRequest

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class VersionServices:
    """What the server lends every loaded version, fixed when it starts (made by ModelManager)."""

    timers: Timers  # the schedulers' queue delays and timeouts
    rate_limiter: RateLimiter | None = None  # --rate-limit=execution_count
    response_cache: ResponseCache | None = None  # --cache-config; models opt in
    latency: statistics.LatencySettings = dataclasses.field(default_factory=statistics.LatencySettings)


class LoadedVersion:
    """One version of one model, ready to serve once `start()` returns."""

    def __init__(self, name: str, version: int, config: mc.ModelConfig, model: Model, model_dir: Path,
                 services: VersionServices) -> None:
        self.services = services
        self.timers = services.timers
        self.rate_limiter = services.rate_limiter
        response_cache = services.response_cache
        self.name = name
        self.version = version
        self.config = config
        self.model = model
        self.model_dir = model_dir
        self.inputs, self.outputs = tensor_specs(config)
        self.batched = config.max_batch_size > 0
        self.decoupled = config.model_transaction_policy.decoupled
        self.layout = ragged_layout(config)
        # Sequence control and state inputs come from the sequence batcher, never from clients;
        # state outputs travel back to it even when the config does not declare them.
        self.validator = RequestValidator(name, config.max_batch_size, self.inputs, self.outputs,
                                          sequence_inputs(config))
        self.builder = ResponseBuilder(name, str(version), self.outputs + state_output_specs(config), self.batched,
                                       _labels(config, model_dir))
        cached = response_cache is not None and serves(config)
        self.stats = ModelStatistics(name, str(version), latency=_latency_settings(config, services.latency),
                                     tags=dict(config.metric_tags), cache_enabled=cached)
        # Only when both the server (--cache-config) and the config enable it: None costs the
        # hot path one attribute check.
        self.cache = (ModelCache(response_cache, self.stats, self.builder)
                      if cached and response_cache is not None else None)
        self._instances: list[ModelInstance] = []
        self._scheduler: Scheduler | None = None
        self._inflight = 0
        self._count_lock = threading.Lock()
        self._drained: threading.Event | None = None  # set once `stop` waits and nothing is in flight
        self.fingerprint: object = None  # of the version directory, to skip unchanged reloads
        self.owns_model = True  # whether stop() closes the backend model (see regrouped)

    def regrouped(self, config: mc.ModelConfig) -> LoadedVersion:
        """A started copy with `config`'s instance groups that shares this version's backend model
        (nothing is reloaded from disk). It owns the model only once it replaces this one."""
        successor = LoadedVersion(self.name, self.version, config, self.model, self.model_dir, self.services)
        successor.owns_model = False
        successor.start()
        successor.fingerprint = self.fingerprint
        return successor

    def hand_model_to(self, successor: LoadedVersion) -> None:
        if successor.model is self.model:
            self.owns_model, successor.owns_model = False, True

    def start(self) -> None:
        """Create every instance, warm each up, then start scheduling; on failure release them all."""
        try:
            for group in self._groups():
                for index in range(group.count):
                    instance = self.model.create_instance(group, index)
                    if isinstance(instance, ThreadedInstance):
                        instance.thread_name = f"{self.name}-{self.version}-instance-{len(self._instances)}"
                    self._instances.append(instance)
                    run_warmup(instance, self.config, self.model_dir)
            # Inside the try: a sequence batcher whose initial_state file is unreadable fails here.
            scheduler = make_scheduler(self.config, self._workers(), self._drop, self.timers,
                                       f"{self.name}-{self.version}", self.model_dir)
        except BaseException:
            self._close_instances()
            raise
        self._scheduler = scheduler
        self._scheduler.start()

    def _groups(self) -> list[mc.ModelInstanceGroup]:
        """The config's instance groups; an ensemble has none and gets one instance (its steps
        run on their own models' instances)."""
        return list(self.config.instance_group) or [mc.ModelInstanceGroup(name=self.name, count=1)]

    def _workers(self) -> list[InstanceWorker]:
        failure_reason = self._instances[0].failure_reason if self._instances else "BACKEND"
        responder = Responder(self.builder, self.stats, self.release, failure_reason)
        limits: list[tuple[RateLimiter, Needs] | None] = [None] * len(self._instances)
        if self.rate_limiter is not None and self.config.instance_group:
            for i, needs in enumerate(self._needs()):
                self.rate_limiter.register(needs)
                limits[i] = (self.rate_limiter, needs)
        return [InstanceWorker(instance, responder, self.batched, self.layout, limit)
                for instance, limit in zip(self._instances, limits, strict=True)]

    def _needs(self) -> list[Needs]:
        """Each instance's rate-limiter resources, in the order the instances were created."""
        needs = []
        for group in self.config.instance_group:
            for index in range(group.count):
                device = group.gpus[index % len(group.gpus)] if group.gpus else 0
                resources = tuple(
                    ((r.name, GLOBAL_DEVICE if getattr(r, "global") else device), r.count)
                    for r in group.rate_limiter.resources
                )
                needs.append(Needs(resources, group.rate_limiter.priority))
        return needs

    def acquire(self) -> None:
        """Count a request in flight; `stop` waits for the count to reach zero."""
        with self._count_lock:
            self._inflight += 1

    def release(self, count: int = 1) -> None:
        with self._count_lock:
            self._inflight -= count
            if self._inflight == 0 and self._drained is not None:
                self._drained.set()

    def submit(self, request: InferRequest, sink: ResponseSink, trace: Trace | None = None) -> Job:
        """Validate and queue; the caller has acquired a slot and releases it if this raises.

        Returns the job, so a caller whose client went away can mark it cancelled."""
        self.validator.validate(request)
        if self._scheduler is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not serving")
        job = make_job(request, sink, self.batched, self.layout.ragged if self.layout else frozenset())
        if self.cache is not None and self.cache.answer(job, self.release):
            return job  # a cache hit: answered without queueing or computing
        if trace is not None:
            job.trace = trace
            trace.stamp("QUEUE_START")
        self._scheduler.submit(job)
        return job

    def _drop(self, job: Job, error: Exception | None) -> None:
        """A job the scheduler dropped (timed out or cancelled): answer it if anyone listens."""
        now = time.monotonic_ns()
        # No error: its client went away while it waited; an error: a queue policy timed it out.
        self.stats.record_failure(now - job.enqueued_ns, "CANCELED" if error is None else "REJECTED")
        self.release()
        if error is not None:
            job.sink(self.builder.error(job.request, error))

    def backend_metrics(self) -> list[MetricRow]:
        """The backend's own metrics, from every instance (an llm model's tokens, KV use...)."""
        return [row for instance in self._instances for row in instance.metrics()]

    def is_ready(self) -> bool:
        """Every instance says it can serve (Python models may define is_ready())."""
        return all(instance.is_ready() for instance in self._instances)

    def not_ready_reason(self) -> str:
        """Why an instance does not serve ("" when every one does): e.g. an LLM engine restarting."""
        for instance in self._instances:
            if not instance.is_ready():
                return instance.not_ready_reason() or "an instance of the model is not ready"
        return ""

    def pending(self) -> int:
        return self._scheduler.pending() if self._scheduler else 0

    def host_bytes_reserved(self) -> int:
        """What the instances hold in host memory, touched or not (an LLM's KV cache)."""
        return sum(instance.host_bytes_reserved() for instance in self._instances)

    def busy(self) -> bool:
        """Requests are in flight or queued (an idle version may be evicted)."""
        return self._inflight > 0 or self.pending() > 0

    def stop(self, timeout: float | None = None) -> None:
        """Wait for in-flight requests (up to `timeout` seconds), then release everything."""
        with self._count_lock:
            self._drained = threading.Event()
            if self._inflight == 0:
                self._drained.set()
        drained = self._drained.wait(timeout)
        if self._scheduler is not None:
            self._scheduler.stop(wait=drained)
            self._scheduler = None
        if not drained:
            # A busy instance can't be closed under its own thread: leave it to finish and exit.
            log.warning("model '%s' version %d unloaded with %d requests still running",
                        self.name, self.version, self._inflight)
            return
        self._close_instances()
        if self.owns_model:
            self.model.close()

    def _close_instances(self) -> None:
        for instance in self._instances:
            try:
                instance.close()
            except Exception:
                log.exception("closing an instance of '%s' failed", self.name)
        self._instances.clear()


FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"


def _latency_settings(config: mc.ModelConfig, settings: statistics.LatencySettings) -> statistics.LatencySettings:
    """The server's latency settings, with this model's own first-response buckets when its
    config's `model_metrics` sets them (Triton's per-model histogram override)."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_FAMILY and control.histogram_options.buckets:
            return dataclasses.replace(settings, buckets_ms=tuple(sorted(control.histogram_options.buckets)))
    return settings


def _labels(config: mc.ModelConfig, model_dir: Path) -> dict[str, list[str]]:
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = model_dir / output.label_filename
            labels[output.name] = path.read_text().splitlines() if path.exists() else []
    return labels
