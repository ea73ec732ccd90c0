"""TensorRT engines on a real GPU (skipped without CUDA and the tensorrt package): an engine
built from the conformance MLP's ONNX graph with dynamic batch profiles, served by naiad."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from backends.conformance import mlp
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.tensorrt import TensorRTModel
from naiad.config.model_config import parse_config_text
from naiad.errors import InvalidArgument
from naiad.types import DataType, InferRequest, Tensor

pytestmark = pytest.mark.gpu


def _gpu_with_tensorrt() -> bool:
    if importlib.util.find_spec("tensorrt") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


if not _gpu_with_tensorrt():
    pytest.skip("no CUDA device with the tensorrt package", allow_module_level=True)


def build_engine(path: Path, profiles: list[tuple[int, int, int]]) -> Path:
    """The MLP as a TensorRT engine with one optimization profile per (min, opt, max) batch."""
    import tensorrt as trt

    onnx_path = path.with_suffix(".onnx")
    mlp.write_onnx(onnx_path)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    for low, opt, high in profiles:
        profile = builder.create_optimization_profile()
        profile.set_shape("INPUT0", (low, mlp.IN), (opt, mlp.IN), (high, mlp.IN))
        config.add_optimization_profile(profile)
    path.write_bytes(bytes(builder.build_serialized_network(network, config)))
    onnx_path.unlink()
    return path


CONFIG = f"""
name: "engine" platform: "tensorrt_plan" max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {mlp.IN} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {mlp.OUT} ] }} ]
"""


def _run(instance: object, x: np.ndarray) -> object:
    request = InferRequest("engine", None, [Tensor("INPUT0", DataType.FP32, x.shape, x)])
    (result,) = instance.execute(Batch([request], batched=True))  # type: ignore[attr-defined]
    return result


def test_an_engine_matches_numpy_at_every_batch_size(tmp_path: Path) -> None:
    build_engine(tmp_path / "model.plan", [(1, 4, 8)])
    model = TensorRTModel(parse_config_text(CONFIG, "engine"), tmp_path, 1)
    instance = model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0]), 0)
    for rows in (1, 3, 8):
        x = np.random.default_rng(rows).standard_normal((rows, mlp.IN)).astype(np.float32)
        np.testing.assert_allclose(_run(instance, x)["OUTPUT0"], mlp.reference(x), rtol=1e-3, atol=1e-3)


def test_an_instance_group_picks_its_profiles(tmp_path: Path) -> None:
    build_engine(tmp_path / "model.plan", [(1, 2, 4), (5, 6, 8)])
    model = TensorRTModel(parse_config_text(CONFIG, "engine"), tmp_path, 1)
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0], profile=["1"])
    instance = model.create_instance(group, 0)
    x6 = np.ones((6, mlp.IN), dtype=np.float32)
    np.testing.assert_allclose(_run(instance, x6)["OUTPUT0"], mlp.reference(x6), rtol=1e-3, atol=1e-3)
    result = _run(instance, np.ones((2, mlp.IN), dtype=np.float32))
    assert isinstance(result, InvalidArgument) and "fit none of the engine's optimization profiles" in str(result)


def test_auto_complete_reads_the_engine(tmp_path: Path) -> None:
    build_engine(tmp_path / "model.plan", [(1, 4, 8)])
    config = mc.ModelConfig(name="engine", platform="tensorrt_plan")
    assert TensorRTModel.auto_complete(config, tmp_path, {})
    assert config.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [mlp.IN])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("OUTPUT0", [mlp.OUT])]


def test_a_config_the_engine_does_not_have_is_refused(tmp_path: Path) -> None:
    build_engine(tmp_path / "model.plan", [(1, 4, 8)])
    wrong = CONFIG.replace('name: "INPUT0"', 'name: "X"')
    model = TensorRTModel(parse_config_text(wrong, "engine"), tmp_path, 1)
    with pytest.raises(InvalidArgument, match="the engine has no input 'X'"):
        model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0]), 0)


def test_served_through_naiad(tmp_path: Path) -> None:
    from conftest import running_server

    version = tmp_path / "engine" / "1"
    version.mkdir(parents=True)
    build_engine(version / "model.plan", [(1, 4, 8)])
    (tmp_path / "engine" / "config.pbtxt").write_text(CONFIG + "instance_group [ { kind: KIND_GPU } ]")
    x = np.random.default_rng(0).standard_normal((2, mlp.IN)).astype(np.float32)
    with running_server(["--model-repository", str(tmp_path)], tmp_path / "naiad.log") as server, \
            httpclient.InferenceServerClient(server.url) as client:
        tensor = httpclient.InferInput("INPUT0", [2, mlp.IN], "FP32")
        tensor.set_data_from_numpy(x)
        out = client.infer("engine", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(out, mlp.reference(x), rtol=1e-3, atol=1e-3)
