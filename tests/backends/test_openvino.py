"""The openvino backend on real OpenVINO: the example MiniLM ONNX against torch's embeddings, config
parameters reaching the compiled model, datatypes, batching, and every load / request failure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino", reason="the openvino extra is not installed")

import openvino as ov
import openvino.opset16 as ops
from backends.conformance import mlp
from backends.conformance.case_openvino import in_process_openvino, write_identity_ir, write_mlp_ir
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.openvino import OpenVinoInstance, OpenVinoModel
from naiad.config.model_config import parse_config_text
from naiad.errors import InvalidArgument, Unavailable
from naiad.types import DataType, InferRequest, Tensor

REFERENCE = json.loads((Path(__file__).parents[1] / "examples" / "minilm_reference.json").read_text())
CPU = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)


def _config(text: str) -> mc.ModelConfig:
    return parse_config_text(f'name: "m" backend: "openvino" {text}', "test")


def _instance(config: mc.ModelConfig, version: Path) -> OpenVinoInstance:
    instance = OpenVinoModel(config, version, 1).create_instance(CPU, 0)
    assert isinstance(instance, OpenVinoInstance)
    return instance


def _run(instance: OpenVinoInstance, arrays: dict[str, np.ndarray], batched: bool = True) -> dict[str, np.ndarray]:
    tensors = [Tensor(n, DataType.from_numpy(a.dtype), a.shape, a) for n, a in arrays.items()]
    (result,) = instance.execute(Batch([InferRequest("m", None, tensors)], batched=batched))
    if isinstance(result, Exception):
        raise result
    return result


def _version(tmp_path: Path) -> Path:
    version = tmp_path / "1"
    version.mkdir(exist_ok=True)
    return version


def _static_identity(version: Path, shape: list[int], layout: str = "") -> Path:
    """An FP32 identity IR with a fixed shape (and optionally a layout naming the batch on both ends)."""
    parameter = ops.parameter(ov.PartialShape(shape), ov.Type.f32, name="INPUT0")
    parameter.output(0).get_tensor().set_names({"INPUT0"})
    if layout:
        parameter.set_layout(ov.Layout(layout))
    result = ops.result(ops.identity(parameter))
    result.input_value(0).get_tensor().set_names({"OUTPUT0"})
    if layout:
        result.set_layout(ov.Layout(layout))
    xml = version / "model.xml"
    ov.save_model(ov.Model([result], [parameter], "static"), str(xml))
    return xml


MLP_CONFIG = ('max_batch_size: 8 input { name: "INPUT0" data_type: TYPE_FP32 dims: [16] } '
              'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] }')


# --------------------------------------------------------------------------- the real model


def test_minilm_onnx_through_openvino_matches_torch(example_repo: Path) -> None:
    version = example_repo / "minilm" / "1"
    assert (version / "model.onnx").is_file(), "examples/prepare.py did not build the MiniLM ONNX"
    config = _config('default_model_filename: "model.onnx"')
    assert OpenVinoModel.auto_complete(config, version, {"default_max_batch_size": 8})
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert "sentence_embedding" in [o.name for o in config.output]
    longest = max(map(len, REFERENCE["input_ids"]))
    ids = np.array([row + [0] * (longest - len(row)) for row in REFERENCE["input_ids"]], np.int64)
    mask = (np.arange(longest)[None, :] < np.array([len(r) for r in REFERENCE["input_ids"]])[:, None])
    out = _run(_instance(config, version), {"input_ids": ids, "attention_mask": mask.astype(np.int64),
                                             "token_type_ids": np.zeros_like(ids)})
    embeddings = out["sentence_embedding"]
    expected = np.array(REFERENCE["sentence_embedding"], np.float32)
    assert embeddings.shape == expected.shape == (3, 384) and embeddings.dtype == np.float32
    cosine = np.sum(embeddings * expected, axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() > 0.999, cosine


def test_mlp_ir_batches_requests_of_any_size_up_to_max(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    instance = _instance(_config(MLP_CONFIG), version)
    x = np.random.default_rng(0).standard_normal((5, mlp.IN)).astype(np.float32)
    requests = [InferRequest("m", None, [Tensor("INPUT0", DataType.FP32, part.shape, part)])
                for part in (x[:1], x[1:4], x[4:])]
    results = instance.execute(Batch(requests, batched=True))
    got = np.concatenate([r["OUTPUT0"] for r in results])  # type: ignore[index]
    np.testing.assert_allclose(got, mlp.reference(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(in_process_openvino(version)(x), mlp.reference(x), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- config parameters


def _parameters(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }} ' for k, v in values.items())


def test_performance_hint_and_streams_reach_the_compiled_model(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    streams = min(2, os.cpu_count() or 1)  # the CPU plugin caps streams at the cores (and threads)
    throughput = _instance(_config(MLP_CONFIG + _parameters(
        PERFORMANCE_HINT="throughput", NUM_STREAMS=str(streams), INFERENCE_NUM_THREADS=str(streams))), version)
    assert str(throughput.compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
    assert int(throughput.compiled.get_property("NUM_STREAMS")) == streams
    assert int(throughput.compiled.get_property("INFERENCE_NUM_THREADS")) == streams
    one_thread = _instance(_config(MLP_CONFIG + _parameters(INFERENCE_NUM_THREADS="1")), version)
    assert int(one_thread.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    latency = _instance(_config(MLP_CONFIG + _parameters(PERFORMANCE_HINT="LATENCY", NUM_STREAMS="1")), version)
    assert str(latency.compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    assert int(latency.compiled.get_property("NUM_STREAMS")) == 1


def test_fp32_by_default_even_where_the_cpu_has_bf16(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    instance = _instance(_config(MLP_CONFIG), version)
    assert instance.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


def test_instances_share_one_compiled_model_with_a_request_each(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    model = OpenVinoModel(_config(MLP_CONFIG), version, 1)
    first, second = model.create_instance(CPU, 0), model.create_instance(CPU, 1)
    assert isinstance(first, OpenVinoInstance) and isinstance(second, OpenVinoInstance)
    assert first.compiled is second.compiled and first.request is not second.request


@pytest.mark.parametrize(("key", "value", "message"), [
    ("PERFORMANCE_HINT", "fast", "'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got 'fast'"),
    ("NUM_STREAMS", "many", "'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got 'many'"),
    ("INFERENCE_NUM_THREADS", "-1", "'INFERENCE_NUM_THREADS' to be a non-negative number, got '-1'"),
    ("COMPILATION_NUM_THREADS", "x", "'COMPILATION_NUM_THREADS' to be a non-negative number, got 'x'"),
    ("HINT_BF16", "NO", "'HINT_BF16' to be YES, got 'NO'"),
    ("ENABLE_BATCH_PADDING", "maybe", "'ENABLE_BATCH_PADDING' to be YES or NO, got 'MAYBE'"),
])
def test_bad_parameter_values_fail_the_load(tmp_path: Path, key: str, value: str, message: str) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    with pytest.raises(InvalidArgument, match=message):
        OpenVinoModel(_config(MLP_CONFIG + _parameters(**{key: value})), version, 1)


def test_a_cpu_extension_that_cannot_load_fails_the_load(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    with pytest.raises(InvalidArgument, match=r"unable to load the CPU extension '/nonexistent/ext\.so'"):
        OpenVinoModel(_config(MLP_CONFIG + _parameters(CPU_EXTENSION_PATH="/nonexistent/ext.so")), version, 1)


# --------------------------------------------------------------------------- load errors


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match=r"unable to find .*model\.xml' for model 'm'"):
        OpenVinoModel(_config(MLP_CONFIG), _version(tmp_path), 1)


def test_corrupt_model_file(tmp_path: Path) -> None:
    version = _version(tmp_path)
    (version / "model.xml").write_text("this is not a model")
    (version / "model.bin").write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"OpenVINO cannot read 'model\.xml'"):
        OpenVinoModel(_config(MLP_CONFIG), version, 1)


def test_ir_without_its_weights(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    (version / "model.bin").unlink()
    with pytest.raises(InvalidArgument, match=r"has no weights file 'model\.bin'"):
        OpenVinoModel(_config(MLP_CONFIG), version, 1)


def test_kind_gpu_without_an_openvino_gpu_device(tmp_path: Path) -> None:
    if any(d.startswith("GPU") for d in ov.Core().available_devices):
        pytest.skip("this machine has an OpenVINO GPU device")
    version = _version(tmp_path)
    write_mlp_ir(version)
    model = OpenVinoModel(_config(MLP_CONFIG), version, 1)
    gpu = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0])
    with pytest.raises(Unavailable, match=r"KIND_GPU needs an OpenVINO GPU device.*sees CPU here"):
        model.create_instance(gpu, 0)


def test_config_naming_a_tensor_the_model_lacks(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    config = _config(MLP_CONFIG.replace('"INPUT0"', '"NOPE"'))
    with pytest.raises(InvalidArgument, match="unexpected inference input 'NOPE', allowed inputs are: INPUT0"):
        OpenVinoModel(config, version, 1)


def test_config_dims_that_contradict_the_model(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    with pytest.raises(InvalidArgument, match=r"tensor 'INPUT0': the model expects 2 dimensions \(shape \[-1, 16\]\)"):
        OpenVinoModel(_config(MLP_CONFIG.replace("dims: [16]", "dims: [17]")), version, 1)


def test_config_string_type_for_a_numeric_tensor(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    expected = "expects datatype TYPE_STRING for input 'INPUT0', model provides TYPE_FP32"
    with pytest.raises(InvalidArgument, match=expected):
        OpenVinoModel(_config(MLP_CONFIG.replace("TYPE_FP32 dims: [16]", "TYPE_STRING dims: [16]")), version, 1)


# --------------------------------------------------------------------------- datatypes


def _identity(tmp_path: Path, datatype: str, config_type: str | None = None) -> OpenVinoInstance:
    version = _version(tmp_path)
    write_identity_ir(version, datatype)
    kind = config_type or ("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")
    return _instance(_config(f'max_batch_size: 4 input {{ name: "INPUT0" data_type: {kind} dims: [-1] }} '
                             f'output {{ name: "OUTPUT0" data_type: {kind} dims: [-1] }}'), version)


def test_int64_beyond_32_bits_is_refused_not_truncated(tmp_path: Path) -> None:
    instance = _identity(tmp_path, "INT64")
    small = np.array([[1, -(2**31), 2**31 - 1]], np.int64)
    assert _run(instance, {"INPUT0": small})["OUTPUT0"].tolist() == small.tolist()
    with pytest.raises(InvalidArgument, match=r"outside \[-2147483648, 2147483647\].*computes int64 inputs in 32 bits"):
        _run(instance, {"INPUT0": np.array([[2**40]], np.int64)})


def test_bytes_round_trip_and_trailing_nul_is_refused(tmp_path: Path) -> None:
    instance = _identity(tmp_path, "BYTES")
    data = np.array([[b"a\x00b", "é".encode(), b"", b"\xff\xfe"]], dtype=object)
    out = _run(instance, {"INPUT0": data})["OUTPUT0"]
    assert out.dtype == object and out.tolist() == data.tolist()
    with pytest.raises(InvalidArgument, match="BYTES ending in a NUL byte"):
        _run(instance, {"INPUT0": np.array([[b"ab\x00"]], dtype=object)})


def test_config_datatype_other_than_the_models_is_converted(tmp_path: Path) -> None:
    """As in Triton's backend: the config's type is what requests carry; OpenVINO converts."""
    instance = _identity(tmp_path, "FP32", config_type="TYPE_INT32")
    data = np.array([[1, -2, 3]], np.int32)
    out = _run(instance, {"INPUT0": data})["OUTPUT0"]
    assert out.dtype == np.int32 and out.tolist() == data.tolist()


# --------------------------------------------------------------------------- shapes and batching


def test_auto_complete_of_a_fixed_shape_model_does_not_batch(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _static_identity(version, [2, 3])
    config = _config("")
    assert not OpenVinoModel.auto_complete(config, version, {"default_max_batch_size": 4})
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 3]


def test_auto_complete_batches_a_fixed_shape_whose_layout_names_the_batch(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _static_identity(version, [1, 16], layout="NC")
    config = _config("")
    assert OpenVinoModel.auto_complete(config, version, {"default_max_batch_size": 4})
    assert config.max_batch_size == 4 and list(config.input[0].dims) == [16]
    x = np.ones((3, 16), np.float32)  # the fixed batch of 1 became dynamic
    assert _run(_instance(config, version), {"INPUT0": x})["OUTPUT0"].shape == (3, 16)


def test_static_batch_needs_padding_enabled(tmp_path: Path) -> None:
    version = _version(tmp_path)
    write_mlp_ir(version)
    x = np.random.default_rng(2).standard_normal((3, mlp.IN)).astype(np.float32)
    strict = _instance(_config(MLP_CONFIG + _parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES")), version)
    with pytest.raises(InvalidArgument, match="expected requests with batch size '8', got '3'"):
        _run(strict, {"INPUT0": x})
    padded = _instance(_config(MLP_CONFIG + _parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES",
                                                        ENABLE_BATCH_PADDING="YES")), version)
    out = _run(padded, {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_allclose(out, mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_reshape_io_layers_opens_fixed_dims(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _static_identity(version, [4, 3])
    body = ('input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1, -1] } '
            'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, -1] }')
    x = np.ones((2, 5), np.float32)
    with pytest.raises(InvalidArgument, match="OpenVINO inference failed"):  # a request error, not a crash
        _run(_instance(_config(body), version), {"INPUT0": x}, batched=False)
    reshaped = _instance(_config(body + _parameters(RESHAPE_IO_LAYERS="YES")), version)
    assert _run(reshaped, {"INPUT0": x}, batched=False)["OUTPUT0"].tolist() == x.tolist()
