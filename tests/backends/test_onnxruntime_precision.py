"""Reduced precision for the onnxruntime backend.

The TensorRT accelerator's Triton keys translated into TensorRT EP options (a pure function; the
GPU run is tests/gpu/test_onnxruntime_tensorrt.py), and the `precision` parameter's fp16 / int8
variants: the conformance MLP in process against numpy, and the real MiniLM encoder served by a
real naiad through tritonclient (HTTP and gRPC) against its fp32 self, with the converted files
in the cache, smaller, and reused by the next load. Tolerances: MiniLM sentence embeddings keep a
cosine above 0.999 (fp16) and 0.99 (int8) to fp32; the MLP stays within 1 % (fp16) and 5 % (int8)
of its output range.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from backends.conformance import mlp
from conftest import ServerProcess, running_server
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from naiad.backends.base import Batch
from naiad.backends.onnxruntime import OnnxRuntimeInstance, OnnxRuntimeModel
from naiad.backends.onnxruntime_precision import (
    cache_dir,
    model_precision,
    precision_variant,
    tensorrt_options,
)
from naiad.config.model_config import parse_config_text
from naiad.errors import InvalidArgument
from naiad.types import DataType, InferRequest, Tensor

REFERENCE = json.loads((Path(__file__).parents[1] / "examples" / "minilm_reference.json").read_text())
CPU = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)
VARIANTS = ("fp32", "fp16", "int8")


# --- TensorRT accelerator parameters -----------------------------------------------------------


def test_tensorrt_precision_modes_become_the_ep_flags():
    assert tensorrt_options({"precision_mode": "FP16"}, 1) == {"device_id": "1", "trt_fp16_enable": "True"}
    assert tensorrt_options({"precision_mode": "INT8"}, 0) == {"device_id": "0", "trt_int8_enable": "True"}
    assert tensorrt_options({"precision_mode": "FP32"}, 0) == {"device_id": "0"}


def test_tensorrt_keys_are_renamed_and_values_normalised(tmp_path, monkeypatch):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path))
    options = tensorrt_options({
        "max_workspace_size_bytes": "1073741824",
        "trt_engine_cache_enable": "1",
        "int8_use_native_calibration_table": "false",
        "int8_calibration_table_name": "calib.flatbuffers",
        "trt_builder_optimization_level": "3",
        "trt_timing_cache_enable": "ON",
        "trt_engine_cache_prefix": "",  # Triton drops empty values
    }, 0)
    assert options == {
        "device_id": "0",
        "trt_max_workspace_size": "1073741824",
        "trt_engine_cache_enable": "True",  # onnxruntime's Python binding refuses "1"
        "trt_int8_use_native_calibration_table": "False",
        "trt_int8_calibration_table_name": "calib.flatbuffers",
        "trt_builder_optimization_level": "3",
        "trt_timing_cache_enable": "True",
        # no path given: engines go to naiad's cache, not the server's working directory
        "trt_engine_cache_path": str(tmp_path / "onnx" / "tensorrt"),
    }
    given = tensorrt_options({"trt_engine_cache_enable": "true", "trt_engine_cache_path": "/engines"}, 0)
    assert given["trt_engine_cache_path"] == "/engines"


@pytest.mark.parametrize(("parameters", "message"), [
    ({"max_cached_engines": "4"}, "unknown parameter 'max_cached_engines' is provided for TensorRT"),
    ({"precision_mode": "fp16"}, "unsupported precision mode 'fp16' is requested"),
    ({"precision_mode": "BF16"}, "unsupported precision mode 'BF16' is requested"),
    ({"trt_dla_core": "abc"}, "failed to convert 'abc' to integral number for parameter 'trt_dla_core'"),
    ({"max_workspace_size_bytes": "-1"}, "'-1' to unsigned integral number for parameter 'max_workspace_size"),
    ({"trt_engine_cache_enable": "yes"}, "'yes' to boolean value for parameter 'trt_engine_cache_enable'"),
])
def test_bad_tensorrt_parameters_are_named(parameters, message):
    with pytest.raises(InvalidArgument, match=message):
        tensorrt_options(parameters, 0)


def _mlp_model(tmp_path: Path, extra: str = "", name: str = "mlp") -> OnnxRuntimeModel:
    version_dir = tmp_path / name / "1"
    version_dir.mkdir(parents=True)
    mlp.write_onnx(version_dir / "model.onnx")
    config = parse_config_text(
        f'name: "{name}" backend: "onnxruntime" max_batch_size: 8 {extra} '
        f'input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [{mlp.IN}] }} '
        f'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{mlp.OUT}] }}', "test")
    return OnnxRuntimeModel(config, version_dir, 1)


def test_a_bad_tensorrt_key_fails_the_load_without_a_gpu(tmp_path):
    # The accelerator only applies to KIND_GPU instances, but a typo must not wait for a GPU to show.
    extra = ('optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
             'parameters { key: "precision" value: "FP16" } } } }')
    with pytest.raises(InvalidArgument, match="unknown parameter 'precision' is provided for TensorRT"):
        _mlp_model(tmp_path, extra)


def test_gpu_instance_providers_carry_the_translated_options(tmp_path):
    extra = ('optimization { execution_accelerators { '
             'gpu_execution_accelerator { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } '
             'parameters { key: "max_workspace_size_bytes" value: "268435456" } } '
             'gpu_execution_accelerator { name: "cuda" parameters { key: "cudnn_conv_use_max_workspace" '
             'value: "0" } } } }')
    config = _mlp_model(tmp_path, extra).config
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[2, 3])
    assert OnnxRuntimeInstance._providers(config, group, 1) == [
        ("TensorrtExecutionProvider",
         {"device_id": "3", "trt_fp16_enable": "True", "trt_max_workspace_size": "268435456"}),
        ("CUDAExecutionProvider", {"device_id": 3, "cudnn_conv_use_max_workspace": "0"}),
        "CPUExecutionProvider",
    ]
    assert OnnxRuntimeInstance._providers(config, CPU, 0) == ["CPUExecutionProvider"]


def test_an_unknown_accelerator_fails_the_load(tmp_path):
    extra = 'optimization { execution_accelerators { cpu_execution_accelerator { name: "naiad_int8" } } }'
    with pytest.raises(InvalidArgument, match="unknown Execution Accelerator 'naiad_int8' is requested"):
        _mlp_model(tmp_path, extra)


# --- fp16 / int8 variants: the conformance MLP in process --------------------------------------


def _precision(value: str) -> str:
    return f'parameters {{ key: "precision" value {{ string_value: "{value}" }} }}'


def _run_mlp(model: OnnxRuntimeModel, x: np.ndarray) -> np.ndarray:
    instance = model.create_instance(CPU, 0)
    request = InferRequest(model.config.name, None, [Tensor("INPUT0", DataType.FP32, x.shape, x)])
    (result,) = instance.execute(Batch([request], batched=True))
    return result["OUTPUT0"]


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-5), ("fp16", 0.01), ("INT8", 0.05)])
def test_mlp_variants_match_numpy(tmp_path, monkeypatch, precision, tolerance):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    model = _mlp_model(tmp_path, _precision(precision))
    x = np.random.default_rng(3).standard_normal((8, mlp.IN)).astype(np.float32)
    expected = mlp.reference(x)
    out = _run_mlp(model, x)
    assert out.dtype == np.float32 and out.shape == expected.shape  # the config's FP32 I/O holds
    assert np.abs(out - expected).max() <= tolerance * np.abs(expected).max()
    if precision == "fp32":
        assert model.session_path == model.path and not (tmp_path / "cache").exists()
    else:
        assert model.session_path.is_relative_to(tmp_path / "cache" / "onnx")
        assert not any(p.name != "model.onnx" for p in model.path.parent.iterdir())  # repository untouched


def test_variant_is_reused_and_remade_when_the_source_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    model = _mlp_model(tmp_path, _precision("int8"))
    first = model.session_path
    stamp = first.stat().st_mtime_ns, first.stat().st_ino
    again = precision_variant(model.path, "int8", "mlp")
    assert again == first and (again.stat().st_mtime_ns, again.stat().st_ino) == stamp
    mlp.write_onnx(model.path, input_name="INPUT0", output_name="OUTPUT0")  # same bytes: same key
    assert precision_variant(model.path, "int8", "mlp") == first
    mlp.write_onnx(model.path, output_name="OTHER")  # a different model: a new variant
    assert precision_variant(model.path, "int8", "mlp") != first
    assert precision_variant(model.path, "fp16", "mlp").parent.name.split("-")[1] == "fp16"


def test_unknown_precision_fails_the_load_naming_model_and_value(tmp_path):
    with pytest.raises(InvalidArgument, match="unable to load model 'mlp': unsupported precision 'int4'"):
        _mlp_model(tmp_path, _precision("int4"))
    assert model_precision({}, "m") == "fp32" and model_precision({"precision": " FP16 "}, "m") == "fp16"


def test_a_model_that_cannot_be_converted_fails_the_load(tmp_path, monkeypatch):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    (version_dir / "model.onnx").write_bytes(b"not an onnx file")
    config = parse_config_text(f'name: "broken" backend: "onnxruntime" {_precision("fp16")}', "test")
    with pytest.raises(InvalidArgument, match="unable to load model 'broken': making its fp16 variant failed"):
        OnnxRuntimeModel(config, version_dir, 1)
    assert not any((tmp_path / "cache" / "onnx").iterdir())  # no half-written variant left behind


# --- fp16 / int8 variants: MiniLM through a real server ------------------------------------------


def _minilm_inputs() -> dict[str, np.ndarray]:
    rows = REFERENCE["input_ids"]
    longest = max(map(len, rows))
    ids = np.array([row + [0] * (longest - len(row)) for row in rows], np.int64)
    mask = (np.arange(longest)[None, :] < np.array([len(r) for r in rows])[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _embed(server: ServerProcess, protocol: str, model: str) -> np.ndarray:
    client_module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    inputs = []
    for name, array in _minilm_inputs().items():
        tensor = client_module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [client_module.InferRequestedOutput("sentence_embedding")]
    with client_module.InferenceServerClient(url) as client:
        return client.infer(model, inputs, outputs=outputs).as_numpy("sentence_embedding")


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _minilm_repo(repo: Path, source: Path) -> None:
    config = (source.parent.parent / "config.pbtxt").read_text()
    models = {f"minilm_{v}": v for v in VARIANTS} | {"minilm_int4": "int4"}
    for name, precision in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").symlink_to(source)  # 90 MB: link, do not copy
        text = config.replace('name: "minilm"', f'name: "{name}"') + _precision(precision) + "\n"
        (repo / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def minilm_server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    source = example_repo / "minilm" / "1" / "model.onnx"
    assert source.is_file(), "examples/prepare.py did not build the MiniLM ONNX"
    root = tmp_path_factory.mktemp("precision")
    repo = root / "repo"
    _minilm_repo(repo, source)
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit",
            *[arg for v in VARIANTS for arg in ("--load-model", f"minilm_{v}")]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NAIAD_CACHE_DIR", str(root / "cache"))  # the server process inherits it
        with running_server(args, root / "naiad.log") as server:
            yield server, args, source, root


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_minilm_variants_agree_with_fp32(minilm_server, protocol):
    server = minilm_server[0]
    fp32 = _embed(server, protocol, "minilm_fp32")
    torch_reference = np.array(REFERENCE["sentence_embedding"], np.float32)
    assert _cosine(fp32, torch_reference).min() > 0.999
    fp16 = _embed(server, protocol, "minilm_fp16")
    int8 = _embed(server, protocol, "minilm_int8")
    assert fp16.dtype == int8.dtype == np.float32 and fp16.shape == int8.shape == fp32.shape
    assert _cosine(fp16, fp32).min() > 0.999
    assert _cosine(int8, fp32).min() > 0.99
    assert not np.array_equal(int8, fp32)  # it really is another model


@pytest.mark.e2e
def test_minilm_variants_are_cached_smaller_and_reused(minilm_server, start_server, monkeypatch):
    _, args, source, root = minilm_server
    cached = {d.name.split("-")[1]: d / "model.onnx" for d in (root / "cache" / "onnx").iterdir()}
    assert sorted(cached) == ["fp16", "int8"]
    full = source.stat().st_size
    assert cached["fp16"].stat().st_size < 0.55 * full  # float16 weights: half
    assert cached["int8"].stat().st_size < 0.30 * full  # int8 weights: a quarter, plus scales
    stamps = {k: (p.stat().st_mtime_ns, p.stat().st_ino) for k, p in cached.items()}

    monkeypatch.setenv("NAIAD_CACHE_DIR", str(root / "cache"))
    again = start_server(args)  # a second load of the same models
    assert _cosine(_embed(again, "http", "minilm_int8"), _embed(again, "http", "minilm_fp32")).min() > 0.99
    assert {k: (p.stat().st_mtime_ns, p.stat().st_ino) for k, p in cached.items()} == stamps
    assert len(os.listdir(root / "cache" / "onnx")) == 2


@pytest.mark.e2e
def test_minilm_with_unknown_precision_fails_its_load(minilm_server):
    server = minilm_server[0]
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match="unsupported precision 'int4'"):
            client.load_model("minilm_int4")
        assert not client.is_model_ready("minilm_int4")
        index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "unable to load model 'minilm_int4': unsupported precision 'int4'" in index["minilm_int4"]["reason"]


def test_cache_dir_follows_naiad_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path / "onnx"
    monkeypatch.delenv("NAIAD_CACHE_DIR")
    assert cache_dir().name == "onnx" and cache_dir().parent.name == f"naiad-{os.getuid()}"
