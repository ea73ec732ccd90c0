import build_models
import numpy as np
import pytest
from onnx import TensorProto

from naiad.backends.base import Batch
from naiad.backends.threaded import ThreadedInstance
from naiad.config.model_config import parse_config_text
from naiad.core.warmup import run_warmup, warmup_requests
from naiad.errors import Unavailable

CONFIG = """
name: "id" backend: "onnxruntime" max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_FP32 dims: [3] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] }
model_warmup { name: "zeros" batch_size: 2 count: 3 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [3] zero_data: true } } }
model_warmup { name: "file" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [3] input_data_file: "in.bin" } } }
"""  # noqa: E501


class Recorder(ThreadedInstance):
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[Batch] = []
        self.fail = fail

    def execute(self, batch: Batch) -> list:
        self.batches.append(batch)
        return [RuntimeError("boom")] if self.fail else [{"OUTPUT0": batch.inputs()["INPUT0"]}]


def test_samples_build_batched_inputs_from_zeros_and_files(tmp_path):
    (tmp_path / "warmup").mkdir()
    np.array([1, 2, 3], dtype=np.float32).tofile(tmp_path / "warmup" / "in.bin")
    samples = warmup_requests(parse_config_text(CONFIG, "t"), tmp_path)
    assert [(name, count) for name, count, _ in samples] == [("zeros", 3), ("file", 1)]
    zeros = samples[0][2].inputs[0]
    assert zeros.shape == (2, 3) and not zeros.data.any()
    assert samples[1][2].inputs[0].data.tolist() == [[1, 2, 3]]


def test_every_sample_runs_count_times(tmp_path):
    (tmp_path / "warmup").mkdir()
    np.zeros(3, dtype=np.float32).tofile(tmp_path / "warmup" / "in.bin")
    instance = Recorder()
    run_warmup(instance, parse_config_text(CONFIG, "t"), tmp_path)
    assert len(instance.batches) == 4


def test_a_failing_sample_fails_the_load(tmp_path):
    (tmp_path / "warmup").mkdir()
    np.zeros(3, dtype=np.float32).tofile(tmp_path / "warmup" / "in.bin")
    with pytest.raises(Unavailable, match="failed to warmup with sample 'zeros': boom"):
        run_warmup(Recorder(fail=True), parse_config_text(CONFIG, "t"), tmp_path)


def test_warmup_runs_on_a_real_onnx_model(tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc

    from naiad.backends.onnxruntime import OnnxRuntimeModel

    (tmp_path / "1").mkdir()
    (tmp_path / "warmup").mkdir()
    np.zeros(3, dtype=np.float32).tofile(tmp_path / "warmup" / "in.bin")
    build_models.identity(tmp_path / "1" / "model.onnx", TensorProto.FLOAT)
    config = parse_config_text(CONFIG, "t")
    instance = OnnxRuntimeModel(config, tmp_path / "1", 1).create_instance(mc.ModelInstanceGroup(), 0)
    run_warmup(instance, config, tmp_path)
