import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import parse_config_text
from naiad.core.scheduling import batcher_settings, make_job, make_scheduler
from naiad.errors import InvalidArgument
from naiad.scheduling.default import DefaultScheduler
from naiad.scheduling.dynamic import TIMEOUT_DELAY, DynamicBatcher
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
