import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, BatchSender, ModelInstance
from naiad.backends.threaded import ThreadedInstance
from naiad.config.model_config import parse_config_text
from naiad.core.scheduling import batcher_settings, make_job, make_scheduler
from naiad.core.worker import InstanceWorker
from naiad.errors import InvalidArgument
from naiad.scheduling.default import DefaultScheduler, SharedQueueScheduler
from naiad.scheduling.dynamic import TIMEOUT_DELAY, DynamicBatcher
from naiad.scheduling.rate_limiter import Needs, RateLimiter
from naiad.scheduling.timers import Timers
from naiad.types import DataType, InferRequest, Tensor


def _request(rows: int, cols: int, **parameters) -> InferRequest:
    data = np.zeros((rows, cols), dtype=np.float32)
    return InferRequest("m", None, [Tensor("X", DataType.FP32, data.shape, data)], parameters=parameters)


def test_jobs_carry_batch_size_shape_key_priority_and_deadline():
    job = make_job(_request(3, 5, priority=2, timeout=1500), lambda r: None, batched=True)
    assert (job.batch_size, job.shape_key, job.priority) == (3, (("X", (5,)),), 2)
    assert job.deadline_ns == job.enqueued_ns + 1_500_000
    plain = make_job(_request(3, 5), lambda r: None, batched=False)
    assert (plain.batch_size, plain.deadline_ns) == (1, 0)


def test_bad_priority_or_timeout_is_invalid():
    with pytest.raises(InvalidArgument, match="'timeout' parameter must be a non-negative integer"):
        make_job(_request(1, 1, timeout=-1), lambda r: None, batched=True)


def test_settings_from_config():
    config = parse_config_text("""
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 preserve_ordering: true
          priority_levels: 2 default_priority_level: 2
          default_queue_policy { max_queue_size: 5 }
          priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 7 } }
        }""", "t")
    settings = batcher_settings(config)
    assert settings.preferred_batch_sizes == (4, 8) and settings.max_queue_delay_ns == 100_000
    assert settings.preserve_ordering and settings.level(0) == 2 and settings.level(1) == 1
    assert settings.policy(2).max_queue_size == 5
    assert settings.policy(1).timeout_action == TIMEOUT_DELAY and settings.policy(1).default_timeout_ns == 7000


def test_scheduler_choice_follows_the_config():
    plain = mc.ModelConfig(max_batch_size=4)
    assert isinstance(make_scheduler(plain, [], lambda j, e: None, Timers(), "m"), DefaultScheduler)
    plain.dynamic_batching.SetInParent()
    assert isinstance(make_scheduler(plain, [], lambda j, e: None, Timers(), "m"), DynamicBatcher)


class _Echo(ThreadedInstance):
    def execute(self, batch: Batch) -> list:
        return [{"OUTPUT0": r.inputs[0].data} for r in batch.requests]


class _Process(ModelInstance):
    """Like a model process: batches are handed over, no thread of its own to pull with."""

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        return False


def test_instances_with_threads_of_their_own_pull_from_one_shared_queue():
    config = mc.ModelConfig(max_batch_size=4)
    drop = lambda j, e: None  # noqa: E731
    threaded = [InstanceWorker(_Echo(), None, True, None) for _ in range(2)]  # type: ignore[arg-type]
    assert isinstance(make_scheduler(config, threaded, drop, Timers(), "m"), SharedQueueScheduler)
    # A model process, or a rate limiter to ask before each batch: batches are handed over.
    process = [InstanceWorker(_Process(), None, True, None)]  # type: ignore[arg-type]
    assert isinstance(make_scheduler(config, process, drop, Timers(), "m"), DefaultScheduler)
    limited = [InstanceWorker(_Echo(), None, True, None, (RateLimiter({}), Needs((), 0)))]  # type: ignore[arg-type]
    assert isinstance(make_scheduler(config, limited, drop, Timers(), "m"), DefaultScheduler)
    config.dynamic_batching.SetInParent()  # batchers hand batches over whatever the instances are
    assert isinstance(make_scheduler(config, threaded, drop, Timers(), "m"), DynamicBatcher)


def test_a_threaded_instance_serves_the_batches_it_takes_then_still_closes():
    instance = _Echo()
    results: list = []

    class Sender(BatchSender):
        def executed(self, times) -> None:
            pass

        def send(self, index: int, result, final: bool) -> None:
            results.append((result["OUTPUT0"].tolist(), final))

        def close_open(self, error) -> None:
            pass

    def request(i: int) -> InferRequest:
        return InferRequest("m", None, [Tensor("INPUT0", DataType.FP32, (1, 2), np.full((1, 2), i, np.float32))])

    batches = [(Batch([request(i)], True), Sender()) for i in range(3)]
    instance.serve(lambda: batches.pop(0) if batches else None)
    instance.close()  # after the served batches: serving ended when take() said so
    assert results == [([[0.0, 0.0]], True), ([[1.0, 1.0]], True), ([[2.0, 2.0]], True)]
