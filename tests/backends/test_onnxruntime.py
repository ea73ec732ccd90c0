from pathlib import Path

import build_models
import numpy as np
import pytest
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.onnxruntime import OnnxRuntimeModel
from naiad.config.model_config import parse_config_text
from naiad.errors import Unavailable
from naiad.types import DataType, InferRequest, Tensor


def _model(tmp_path: Path, elem_type: int, datatype: str, extra: str = "") -> OnnxRuntimeModel:
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    build_models.identity(version_dir / "model.onnx", elem_type)
    config = parse_config_text(
        f'name: "id" backend: "onnxruntime" max_batch_size: 4 {extra}'
        f'input {{ name: "INPUT0" data_type: {datatype} dims: [-1] }}'
        f'output {{ name: "OUTPUT0" data_type: {datatype} dims: [-1] }}', "test")
    return OnnxRuntimeModel(config, version_dir, 1)


def _run(model: OnnxRuntimeModel, data: np.ndarray, datatype: DataType) -> np.ndarray:
    instance = model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0)
    request = InferRequest("id", None, [Tensor("INPUT0", datatype, data.shape, data)])
    (result,) = instance.execute(Batch([request], batched=True))
    return result["OUTPUT0"]


def test_bytes_round_trip_keeps_embedded_nul_and_utf8(tmp_path):
    data = np.array([[b"a\x00b", "é".encode(), b""]], dtype=object)
    out = _run(_model(tmp_path, TensorProto.STRING, "TYPE_STRING"), data, DataType.BYTES)
    assert out.tolist() == data.tolist()


def test_bf16_passes_raw_bits(tmp_path):
    data = np.array([[0x3F80, 0x4000, 0xBF80]], dtype=np.uint16)  # 1.0, 2.0, -1.0
    out = _run(_model(tmp_path, TensorProto.BFLOAT16, "TYPE_BF16"), data, DataType.BF16)
    assert out.dtype == np.uint16 and out.tolist() == data.tolist()


def test_auto_complete_reads_inputs_and_outputs(tmp_path):
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    build_models.add_sub(version_dir / "model.onnx")
    config = mc.ModelConfig(name="simple", backend="onnxruntime")
    made_batching = OnnxRuntimeModel.auto_complete(config, version_dir, {"default_max_batch_size": 4})
    assert made_batching and config.max_batch_size == 4
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]


def test_missing_execution_provider_is_a_clear_load_error(tmp_path):
    model = _model(tmp_path, TensorProto.FLOAT, "TYPE_FP32",
                   'optimization { execution_accelerators { cpu_execution_accelerator { name: "openvino" } } }')
    with pytest.raises(Unavailable, match="OpenVINOExecutionProvider"):
        model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0)


def test_missing_model_file(tmp_path):
    (tmp_path / "1").mkdir()
    config = mc.ModelConfig(name="gone", backend="onnxruntime")
    with pytest.raises(Unavailable, match="unable to find"):
        OnnxRuntimeModel(config, tmp_path / "1", 1)


def test_session_threads_from_config_parameters(tmp_path):
    model = _model(tmp_path, TensorProto.FLOAT, "TYPE_FP32",
                   'parameters { key: "intra_op_thread_count" value { string_value: "2" } }')
    instance = model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0)
    assert instance.session.get_session_options().intra_op_num_threads == 2


@pytest.mark.parametrize(("extra", "anywhere"), [
    ("", True),  # one intra-op thread, sequential: a run is the calling thread's own work
    ('parameters { key: "intra_op_thread_count" value { string_value: "2" } }', False),
    ('parameters { key: "execution_mode" value { string_value: "1" } }', False),
])
def test_only_a_single_threaded_cpu_session_may_run_on_the_submitting_thread(tmp_path, extra, anywhere):
    model = _model(tmp_path, TensorProto.FLOAT, "TYPE_FP32", extra)
    instance = model.create_instance(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0)
    assert instance.runs_anywhere is anywhere
