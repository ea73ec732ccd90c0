"""ONNX Runtime's TensorRT execution provider with Triton's precision flags on an NVIDIA GPU.

A KIND_GPU instance of the conformance MLP with
`gpu_execution_accelerator { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }`
must run on the TensorRT EP with FP16 enabled and the engine cached outside the repository, and
its answer must stay within FP16 tolerance of numpy. Skipped unless onnxruntime offers the
TensorRT EP (onnxruntime-gpu with TensorRT's libraries, on a GPU machine).
"""

from pathlib import Path

import numpy as np
import pytest
from backends.conformance import mlp
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.onnxruntime import OnnxRuntimeModel
from naiad.config.model_config import parse_config_text
from naiad.types import DataType, InferRequest, Tensor

ort = pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("TensorrtExecutionProvider" not in ort.get_available_providers(),
                       reason="no TensorRT execution provider in this onnxruntime"),
]


def _model(tmp_path: Path, parameters: str) -> OnnxRuntimeModel:
    version_dir = tmp_path / "mlp" / "1"
    version_dir.mkdir(parents=True)
    mlp.write_onnx(version_dir / "model.onnx")
    config = parse_config_text(
        'name: "mlp" backend: "onnxruntime" max_batch_size: 8 '
        f'input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [{mlp.IN}] }} '
        f'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{mlp.OUT}] }} '
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
        f'{parameters} }} }} }}',
        "test")
    return OnnxRuntimeModel(config, version_dir, 1)


def test_fp16_precision_mode_runs_on_tensorrt(tmp_path, monkeypatch):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    model = _model(tmp_path, 'parameters { key: "precision_mode" value: "FP16" } '
                             'parameters { key: "max_workspace_size_bytes" value: "268435456" } '
                             'parameters { key: "trt_engine_cache_enable" value: "1" }')
    instance = model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0]), 0)
    assert instance.session.get_providers()[0] == "TensorrtExecutionProvider"
    options = instance.session.get_provider_options()["TensorrtExecutionProvider"]
    assert options["trt_fp16_enable"] in ("1", "True") and options["trt_int8_enable"] in ("0", "False")
    assert options["trt_max_workspace_size"] == "268435456"

    x = np.random.default_rng(5).standard_normal((8, mlp.IN)).astype(np.float32)
    request = InferRequest("mlp", None, [Tensor("INPUT0", DataType.FP32, x.shape, x)])
    (result,) = instance.execute(Batch([request], batched=True))
    expected = mlp.reference(x)
    assert np.abs(result["OUTPUT0"] - expected).max() <= 0.01 * np.abs(expected).max()
    engines = list((tmp_path / "cache" / "onnx" / "tensorrt").glob("*.engine"))
    assert engines, "the TensorRT engine was not cached under NAIAD_CACHE_DIR"
