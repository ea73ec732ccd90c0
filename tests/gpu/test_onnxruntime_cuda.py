"""ONNX Runtime on an NVIDIA GPU: KIND_GPU instances use the CUDA execution provider.

Skipped unless onnxruntime can see CUDA (install onnxruntime-gpu on a GPU machine to run them).
"""

import build_models
import numpy as np
import pytest
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.onnxruntime import OnnxRuntimeModel
from naiad.config.model_config import parse_config_text
from naiad.types import DataType, InferRequest, Tensor

ort = pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA provider"),
]


def test_kind_gpu_instance_runs_on_cuda(tmp_path):
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    build_models.identity(version_dir / "model.onnx", TensorProto.FLOAT)
    config = parse_config_text(
        'name: "id" backend: "onnxruntime" max_batch_size: 4 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] } '
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }', "test")
    model = OnnxRuntimeModel(config, version_dir, 1)
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0])
    instance = model.create_instance(group, 0)
    assert instance.session.get_providers()[0] == "CUDAExecutionProvider"
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    (result,) = instance.execute(Batch([InferRequest("id", None, [Tensor("INPUT0", DataType.FP32, (2, 4), data)])],
                                       batched=True))
    np.testing.assert_array_equal(result["OUTPUT0"], data)
