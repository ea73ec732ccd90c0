"""The tensorrt backend where there is no GPU (as on CI): a TensorRT model fails to load with a
reason that says what is missing, and the rest of the repository serves. The GPU path is tested
in tests/gpu/test_tensorrt.py."""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from backends.conformance import mlp
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.tensorrt import NO_GPU, NO_PACKAGE, TensorRTModel
from naiad.config.model_config import parse_config_text
from naiad.errors import Unavailable

CONFIG = f"""
name: "engine"
platform: "tensorrt_plan"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {mlp.IN} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {mlp.OUT} ] }} ]
"""


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _expected_reason() -> str:
    return NO_PACKAGE if importlib.util.find_spec("tensorrt") is None else NO_GPU


pytestmark = pytest.mark.skipif(_cuda() and importlib.util.find_spec("tensorrt") is not None,
                                reason="a GPU with TensorRT is here: tests/gpu/test_tensorrt.py covers it")


def test_an_instance_without_gpu_or_package_says_which(tmp_path: Path) -> None:
    (tmp_path / "model.plan").write_bytes(b"engine bytes")
    model = TensorRTModel(parse_config_text(CONFIG, "engine"), tmp_path, 1)
    with pytest.raises(Unavailable) as raised:
        model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0]), 0)
    assert str(raised.value) == _expected_reason()


def test_auto_complete_needs_the_engine_and_says_why_it_cannot_read_it(tmp_path: Path) -> None:
    (tmp_path / "model.plan").write_bytes(b"engine bytes")
    config = mc.ModelConfig(name="engine", platform="tensorrt_plan")
    with pytest.raises(Unavailable, match="TensorRT"):
        TensorRTModel.auto_complete(config, tmp_path, {})


def test_the_repository_serves_on_without_the_tensorrt_model(tmp_path: Path) -> None:
    from conftest import running_server

    engine_dir = tmp_path / "engine" / "1"
    engine_dir.mkdir(parents=True)
    (tmp_path / "engine" / "config.pbtxt").write_text(CONFIG)
    (engine_dir / "model.plan").write_bytes(b"engine bytes")
    onnx_dir = tmp_path / "mlp" / "1"
    onnx_dir.mkdir(parents=True)
    mlp.write_onnx(onnx_dir / "model.onnx")
    (tmp_path / "mlp" / "config.pbtxt").write_text('backend: "onnxruntime" max_batch_size: 8')
    with running_server(["--model-repository", str(tmp_path), "--exit-on-error=false",
                         "--strict-readiness=false"], tmp_path / "naiad.log") as server:
        index = _index(server)
        assert index["engine"]["state"] == "UNAVAILABLE"
        assert index["engine"]["reason"] == _expected_reason()
        assert index["mlp"]["state"] == "READY"
        x = np.ones((1, mlp.IN), dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, mlp.IN], "FP32")
        tensor.set_data_from_numpy(x)
        with httpclient.InferenceServerClient(server.url) as client:
            out = client.infer("mlp", [tensor]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(out, mlp.reference(x), rtol=1e-4, atol=1e-5)


def _index(server: Any) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return {entry["name"]: entry for entry in json.loads(answer.read())}
