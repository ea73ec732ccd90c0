"""Which scheduler a model version gets, and the batching facts of each job (from its config)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import BatchInput, RaggedLayout
from naiad.core.sequence_settings import sequence_settings
from naiad.core.worker import InstanceWorker
from naiad.errors import InvalidArgument
from naiad.scheduling.base import Drop, Job, ResponseSink, Scheduler, Worker
from naiad.scheduling.default import DefaultScheduler, SharedQueueScheduler
from naiad.scheduling.dynamic import BatcherSettings, DynamicBatcher, QueuePolicy
from naiad.scheduling.sequence import SequenceBatcher
from naiad.scheduling.timers import Timers
from naiad.types import DataType, InferRequest

_US = 1000


def make_scheduler(config: mc.ModelConfig, workers: Sequence[Worker], drop: Drop, timers: Timers, name: str,
                   model_dir: Path | None = None) -> Scheduler:
    """The dynamic or sequence batcher when the config asks for one, else Triton's default
    scheduler. `model_dir` holds the sequence batcher's initial_state files."""
    choice = config.WhichOneof("scheduling_choice")
    if choice == "sequence_batching":
        return SequenceBatcher(workers, sequence_settings(config, model_dir), drop, timers, name=name)
    # Instances with threads of their own take their work themselves when idle (all or none do).
    pulling = [worker for worker in workers if isinstance(worker, InstanceWorker) and worker.pulls]
    if len(pulling) != len(workers):
        pulling = []
    if choice == "dynamic_batching":
        return DynamicBatcher(workers, batcher_settings(config), drop, timers, name=name, pullers=pulling)
    if pulling:
        return SharedQueueScheduler(pulling, drop, name=name)
    return DefaultScheduler(workers, drop, timers, name=name)


def batcher_settings(config: mc.ModelConfig) -> BatcherSettings:
    batching = config.dynamic_batching
    return BatcherSettings(
        max_batch_size=max(config.max_batch_size, 1),
        preferred_batch_sizes=tuple(batching.preferred_batch_size),
        max_queue_delay_ns=batching.max_queue_delay_microseconds * _US,
        preserve_ordering=batching.preserve_ordering and not config.model_transaction_policy.decoupled,
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        default_policy=_policy(batching.default_queue_policy),
        level_policies={level: _policy(p) for level, p in batching.priority_queue_policy.items()},
    )


def _policy(policy: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=policy.timeout_action,
        default_timeout_ns=policy.default_timeout_microseconds * _US,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def ragged_layout(config: mc.ModelConfig) -> RaggedLayout | None:
    """Ragged inputs and batch inputs of a config; None when it has neither (the common case)."""
    ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
    batch_inputs = tuple(
        BatchInput(mc.BatchInput.Kind.Name(b.kind), target, DataType.from_config(mc.DataType.Name(b.data_type)).numpy,
                   b.source_input[0] if b.source_input else "")
        for b in config.batch_input
        for target in b.target_name
    )
    return RaggedLayout(ragged, batch_inputs) if ragged or batch_inputs else None


def make_job(request: InferRequest, sink: ResponseSink, batched: bool, ragged: frozenset[str] = frozenset()) -> Job:
    """A job with its batch size, shape key, priority and deadline taken from the request;
    ragged inputs leave the shape key, so requests differing only there batch together."""
    job = Job(request, sink)
    if batched and request.inputs:
        job.batch_size = request.inputs[0].shape[0]
        job.shape_key = tuple([(t.name, t.shape[1:]) for t in request.inputs if t.name not in ragged])
    parameters = request.parameters
    if parameters:
        job.priority = _unsigned(parameters, "priority")
        timeout_us = _unsigned(parameters, "timeout")
        job.deadline_ns = job.enqueued_ns + timeout_us * _US if timeout_us else 0
    return job


def _unsigned(parameters: dict[str, Any], key: str) -> int:
    value = parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"'{key}' parameter must be a non-negative integer, got {value!r}")
    return value


