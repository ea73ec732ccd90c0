"""The TensorFlow backend on real SavedModels built here: signature selection, auto-complete,
string and bfloat16 tensors, batching, threads, and every load failure with its message."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")

from backends.conformance import mlp
from backends.conformance.case_tensorflow import save_function, save_identity, save_mlp
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.registry import backend_class
from naiad.backends.tensorflow import TensorFlowModel, import_tensorflow
from naiad.config.model_config import parse_config_text
from naiad.errors import InvalidArgument, Unavailable, Unsupported
from naiad.types import DataType, InferRequest, Tensor

tf = import_tensorflow()
CPU = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)
F32 = tf.TensorSpec([None, 4], tf.float32)
MLP_IO = (f'max_batch_size: 8 input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {mlp.IN} ] }} '
          f'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {mlp.OUT} ] }}')


def _config(text: str = "", name: str = "m") -> mc.ModelConfig:
    return parse_config_text(f'name: "{name}" backend: "tensorflow" platform: "tensorflow_savedmodel" {text}', "test")


def _io(datatype: str = "TYPE_FP32", dims: str = "[ 4 ]", inputs: tuple[str, ...] = ("INPUT0",),
        outputs: tuple[str, ...] = ("OUTPUT0",)) -> str:
    return ("".join(f'input {{ name: "{n}" data_type: {datatype} dims: {dims} }} ' for n in inputs)
            + "".join(f'output {{ name: "{n}" data_type: {datatype} dims: {dims} }} ' for n in outputs))


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }} '


def _run(model: TensorFlowModel, *requests: dict[str, np.ndarray]) -> list[Any]:
    instance = model.create_instance(CPU, 0)
    batch = Batch([InferRequest(model.config.name, None, [
        Tensor(name, DataType.from_numpy(a.dtype) if a.dtype != np.uint16 else _declared(model, name),
               a.shape, a) for name, a in r.items()]) for r in requests], batched=model.config.max_batch_size > 0)
    return instance.execute(batch)


def _declared(model: TensorFlowModel, name: str) -> DataType:
    (io,) = [i for i in model.config.input if i.name == name]
    return DataType.from_config(mc.DataType.Name(io.data_type))


@pytest.fixture(scope="module")
def two_signatures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """serving_default: OUTPUT0 = INPUT0 + 1; "double": OUTPUT0 = INPUT0 * 2; "named" has other keys."""
    version = tmp_path_factory.mktemp("sigs") / "1"
    module = tf.Module()
    plus = tf.function(lambda INPUT0: {"OUTPUT0": INPUT0 + 1}).get_concrete_function(INPUT0=F32)
    double = tf.function(lambda INPUT0: {"OUTPUT0": INPUT0 * 2}).get_concrete_function(INPUT0=F32)
    named = tf.function(lambda x: {"y": x - 1}).get_concrete_function(x=F32)
    tf.saved_model.save(module, str(version / "model.savedmodel"),
                        signatures={"serving_default": plus, "double": double, "named": named})
    return version


# --- signature selection -------------------------------------------------------------------------


def test_default_signature_is_serving_default(two_signatures):
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io()), two_signatures, 1)
    (out,) = _run(model, {"INPUT0": np.ones((2, 4), np.float32)})
    assert out["OUTPUT0"].tolist() == [[2.0] * 4] * 2


def test_tf_signature_def_selects_another_signature(two_signatures):
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io() + _param("TF_SIGNATURE_DEF", "double")),
                            two_signatures, 1)
    (out,) = _run(model, {"INPUT0": np.full((1, 4), 3, np.float32)})
    assert out["OUTPUT0"].tolist() == [[6.0] * 4]


def test_names_are_the_signature_keys(two_signatures):
    config = _config("max_batch_size: 4 " + _io(inputs=("x",), outputs=("y",)) + _param("TF_SIGNATURE_DEF", "named"))
    (out,) = _run(TensorFlowModel(config, two_signatures, 1), {"x": np.zeros((1, 4), np.float32)})
    assert out["y"].tolist() == [[-1.0] * 4]


def test_unknown_signature_names_the_ones_there(two_signatures):
    config = _config("max_batch_size: 4 " + _io() + _param("TF_SIGNATURE_DEF", "nope"))
    with pytest.raises(InvalidArgument, match=r"has no signature 'nope'.*double, named, serving_default"):
        TensorFlowModel(config, two_signatures, 1)


def test_unknown_graph_tag_names_the_tag_sets(two_signatures):
    config = _config("max_batch_size: 4 " + _io() + _param("TF_GRAPH_TAG", "gpu"))
    with pytest.raises(InvalidArgument, match=r"no meta graph tagged 'gpu'.*tag sets are: serve"):
        TensorFlowModel(config, two_signatures, 1)


# --- auto-complete -------------------------------------------------------------------------------


def test_auto_complete_from_the_signature(two_signatures):
    config = _config(_param("TF_SIGNATURE_DEF", "named"))
    assert TensorFlowModel.auto_complete(config, two_signatures, {"default_max_batch_size": 6})
    assert config.max_batch_size == 6
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [("x", "TYPE_FP32", [4])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("y", [4])]


def test_auto_complete_orders_keys_and_types(tmp_path):
    version = tmp_path / "1"
    save_function(version / "model.savedmodel",
                  lambda B, A: {"Z": tf.strings.length(B), "C": tf.cast(A, tf.float64)},
                  {"B": tf.TensorSpec([None, 3], tf.string), "A": tf.TensorSpec([None, 3], tf.int8)})
    config = _config()
    TensorFlowModel.auto_complete(config, version, {})
    assert [(i.name, mc.DataType.Name(i.data_type)) for i in config.input] == [("A", "TYPE_INT8"), ("B", "TYPE_STRING")]
    assert [(o.name, mc.DataType.Name(o.data_type)) for o in config.output] == [("C", "TYPE_FP64"), ("Z", "TYPE_INT32")]


def test_a_fixed_first_dimension_does_not_batch(tmp_path):
    version = tmp_path / "1"
    save_identity(version / "model.savedmodel", "FP32", (2, 5))
    config = _config()
    assert not TensorFlowModel.auto_complete(config, version, {"default_max_batch_size": 4})
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 5]
    with pytest.raises(InvalidArgument, match="does not support batching"):
        TensorFlowModel.auto_complete(_config("max_batch_size: 4"), version, {})


def test_auto_complete_fills_only_what_the_config_leaves_out(two_signatures):
    config = _config('max_batch_size: 2 input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } '
                     'output { name: "OUTPUT0" }')
    TensorFlowModel.auto_complete(config, two_signatures, {})
    assert config.max_batch_size == 2
    assert mc.DataType.Name(config.output[0].data_type) == "TYPE_FP32" and list(config.output[0].dims) == [4]


def test_auto_completed_config_loads_and_runs(two_signatures):
    config = _config()
    TensorFlowModel.auto_complete(config, two_signatures, {})
    (out,) = _run(TensorFlowModel(config, two_signatures, 1), {"INPUT0": np.zeros((3, 4), np.float32)})
    assert out["OUTPUT0"].shape == (3, 4)


def test_unknown_rank_needs_dims_in_the_config(tmp_path):
    version = tmp_path / "1"
    save_function(version / "model.savedmodel", lambda INPUT0: {"OUTPUT0": INPUT0},
                  {"INPUT0": tf.TensorSpec(None, tf.float32)})
    with pytest.raises(InvalidArgument, match="does not give the rank of 'INPUT0'"):
        TensorFlowModel.auto_complete(_config(), version, {})
    config = _config("max_batch_size: 4 " + _io(dims="[ 3 ]"))
    TensorFlowModel.auto_complete(config, version, {})
    (out,) = _run(TensorFlowModel(config, version, 1), {"INPUT0": np.ones((2, 3), np.float32)})
    assert out["OUTPUT0"].tolist() == [[1.0] * 3] * 2


def test_the_registry_knows_the_backend():
    assert backend_class("tensorflow") is TensorFlowModel


# --- tensors -------------------------------------------------------------------------------------


def test_bytes_keep_nul_non_utf8_and_unicode(tmp_path):
    version = tmp_path / "1"
    save_identity(version / "model.savedmodel", "BYTES")
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io("TYPE_STRING", "[ -1 ]")), version, 1)
    data = np.array([[b"a\x00b", b"\xff\xfe", "\u00e9\u4e2d".encode(), b""]], dtype=object)
    (out,) = _run(model, {"INPUT0": data})
    assert out["OUTPUT0"].dtype == object and out["OUTPUT0"].tolist() == data.tolist()


def test_a_string_op_reads_the_bytes(tmp_path):
    version = tmp_path / "1"
    save_function(version / "model.savedmodel", lambda TEXT: {"LENGTH": tf.strings.length(TEXT)},
                  {"TEXT": tf.TensorSpec([None], tf.string)})
    config = _config()
    TensorFlowModel.auto_complete(config, version, {})
    assert list(config.input[0].dims) == [1] and config.input[0].HasField("reshape")  # scalar per item
    (out,) = _run(TensorFlowModel(config, version, 1), {"TEXT": np.array([[b"abc"], [b"\x00\x01"]], dtype=object)})
    assert out["LENGTH"].tolist() == [[3], [2]]


def test_bf16_passes_raw_bits(tmp_path):
    version = tmp_path / "1"
    save_identity(version / "model.savedmodel", "BF16")
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io("TYPE_BF16", "[ -1 ]")), version, 1)
    data = np.array([[0x3F80, 0x4000, 0xBF80]], dtype=np.uint16)  # 1.0, 2.0, -1.0
    (out,) = _run(model, {"INPUT0": data})
    assert out["OUTPUT0"].dtype == np.uint16 and out["OUTPUT0"].tolist() == data.tolist()


def test_a_batch_of_requests_is_split_back(tmp_path):
    version = tmp_path / "1"
    save_mlp(version / "model.savedmodel")
    model = TensorFlowModel(_config(MLP_IO), version, 1)
    rows = [np.random.default_rng(i).standard_normal((i + 1, mlp.IN)).astype(np.float32) for i in range(3)]
    results = _run(model, *({"INPUT0": r} for r in rows))
    for row, result in zip(rows, results, strict=True):
        np.testing.assert_allclose(result["OUTPUT0"], mlp.reference(row), rtol=1e-5, atol=1e-6)


def test_data_the_graph_refuses_fails_the_requests_not_the_instance(tmp_path):
    version = tmp_path / "1"
    save_function(version / "model.savedmodel", lambda INPUT0: {"OUTPUT0": tf.reshape(INPUT0, [-1, 2])},
                  {"INPUT0": tf.TensorSpec([None, None], tf.float32)})
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io(dims="[ -1 ]", outputs=()) +
                                    'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }'), version, 1)
    (error,) = _run(model, {"INPUT0": np.ones((1, 3), np.float32)})
    assert isinstance(error, InvalidArgument) and "TensorFlow refused the input" in str(error)
    (ok,) = _run(model, {"INPUT0": np.ones((1, 4), np.float32)})
    assert ok["OUTPUT0"].shape == (2, 2)


def test_instances_share_one_load_and_run_concurrently(two_signatures):
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io()), two_signatures, 1)
    instances = [model.create_instance(CPU, i) for i in range(4)]
    assert len({id(i.function) for i in instances}) == 1
    failures: list[str] = []

    def hammer(k: int) -> None:
        for j in range(50):
            x = np.full((2, 4), k * 100 + j, np.float32)
            request = InferRequest("m", None, [Tensor("INPUT0", DataType.FP32, x.shape, x)])
            (out,) = instances[k].execute(Batch([request], batched=True))
            if out["OUTPUT0"].tolist() != (x + 1).tolist():
                failures.append(f"{k}/{j}")

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures


def test_gpu_instances_need_a_gpu_tensorflow_sees(two_signatures):
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io()), two_signatures, 1)
    group = mc.ModelInstanceGroup(name="g", kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0])
    if tf.config.list_physical_devices("GPU"):
        assert model.create_instance(group, 0).device == "/GPU:0"
    else:
        with pytest.raises(Unavailable, match="asks for GPU 0, but TensorFlow sees 0 GPU"):
            model.create_instance(group, 0)


# --- threads -------------------------------------------------------------------------------------


def test_thread_counts_apply_to_a_fresh_process(two_signatures):
    """TF's pools are process-wide and fixed at start: check them in a process of their own."""
    script = f"""
import sys
from pathlib import Path
from tritonclient.grpc import model_config_pb2 as mc
from naiad.backends.tensorflow import TensorFlowModel, import_tensorflow
from naiad.config.model_config import parse_config_text
config = parse_config_text('''name: "m" backend: "tensorflow" max_batch_size: 4 {_io()}
{_param("TF_NUM_INTRA_THREADS", "3")} {_param("TF_NUM_INTER_THREADS", "2")}''', "t")
TensorFlowModel(config, Path({str(two_signatures)!r}), 1)
t = import_tensorflow().config.threading
print(t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "2"]
    assert "oneDNN" not in done.stderr  # imported quietly


def test_a_bad_thread_count_is_a_load_error(two_signatures):
    with pytest.raises(InvalidArgument, match="TF_NUM_INTRA_THREADS must be an integer, got 'many'"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io() + _param("TF_NUM_INTRA_THREADS", "many")),
                        two_signatures, 1)


# --- load errors ---------------------------------------------------------------------------------


def test_missing_savedmodel_directory(tmp_path):
    (tmp_path / "1").mkdir()
    with pytest.raises(Unavailable, match=r"unable to find '.*1/model.savedmodel'.*SavedModel directory"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io()), tmp_path / "1", 1)


def test_a_file_where_the_directory_should_be(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.savedmodel").write_bytes(b"this is not a model")
    with pytest.raises(InvalidArgument, match="is not a SavedModel directory"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io()), tmp_path / "1", 1)


def test_a_directory_without_saved_model_pb(tmp_path):
    (tmp_path / "1" / "model.savedmodel").mkdir(parents=True)
    with pytest.raises(InvalidArgument, match=r"holds no saved_model.pb"):
        TensorFlowModel.auto_complete(_config(), tmp_path / "1", {})


def test_a_corrupt_saved_model_pb(tmp_path):
    (tmp_path / "1" / "model.savedmodel").mkdir(parents=True)
    (tmp_path / "1" / "model.savedmodel" / "saved_model.pb").write_bytes(b"\xff\xff\xff garbage")
    with pytest.raises(InvalidArgument, match=r"saved_model.pb' is corrupt"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io()), tmp_path / "1", 1)


def test_missing_variables_fail_the_load_with_tensorflows_reason(tmp_path):
    version = tmp_path / "1"
    save_mlp(version / "model.savedmodel")
    for f in (version / "model.savedmodel" / "variables").iterdir():
        f.write_bytes(b"truncated")
    with pytest.raises(InvalidArgument, match=r"unable to load model 'm' from '.*model.savedmodel': \S"):
        TensorFlowModel(_config(MLP_IO), version, 1)


@pytest.mark.parametrize(("body", "message"), [
    ("max_batch_size: 4 " + _io(inputs=("NOPE",)), "unexpected inference input 'NOPE', allowed inputs are: INPUT0"),
    ("max_batch_size: 4 " + _io(outputs=("NOPE",)), "unexpected inference output 'NOPE', allowed outputs are: OUTPUT0"),
    ("max_batch_size: 4 " + _io(inputs=("INPUT0", "INPUT1")), "configuration expects 2 inputs, model provides 1"),
    ("max_batch_size: 4 " + _io("TYPE_INT32"),
     "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"),
    ("max_batch_size: 4 " + _io(dims="[ 5 ]"), r"input 'INPUT0': the model's shape \[-1, 4\] does not match"),
    (_io(dims="[ 4 ]"), r"the model's shape \[-1, 4\] does not match the configuration's \[4\]"),
])
def test_a_config_the_signature_does_not_match(two_signatures, body, message):
    with pytest.raises(InvalidArgument, match=message):
        TensorFlowModel(_config(body), two_signatures, 1)


def test_batching_needs_a_variable_first_dimension(tmp_path):
    version = tmp_path / "1"
    save_identity(version / "model.savedmodel", "FP32", (2, 5))
    with pytest.raises(InvalidArgument, match="max_batch_size > 0 needs a variable first dimension"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io(dims="[ 5 ]")), version, 1)


def test_graphdef_models_are_refused_clearly(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.graphdef").write_bytes(b"")
    config = parse_config_text('name: "g" backend: "tensorflow" platform: "tensorflow_graphdef"', "test")
    with pytest.raises(Unsupported, match=r"tensorflow_graphdef .* is not supported; export the model as a SavedModel"):
        TensorFlowModel.auto_complete(config, tmp_path / "1", {})


def test_session_parameters_are_ignored_with_a_warning(two_signatures, caplog):
    config = _config("max_batch_size: 4 " + _io() + _param("MAX_SESSION_SHARE_COUNT", "2"))
    TensorFlowModel(config, two_signatures, 1)
    assert "parameter MAX_SESSION_SHARE_COUNT is ignored" in caplog.text


def test_sequence_control_inputs_count_as_fed(tmp_path):
    version = tmp_path / "1"
    save_function(version / "model.savedmodel", lambda INPUT0, START: {"OUTPUT0": INPUT0 + START},
                  {"INPUT0": F32, "START": tf.TensorSpec([None, 1], tf.float32)})
    control = ('sequence_batching { control_input [ { name: "START" control [ '
               '{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }')
    model = TensorFlowModel(_config("max_batch_size: 4 " + _io() + control), version, 1)
    (out,) = _run(model, {"INPUT0": np.zeros((1, 4), np.float32), "START": np.ones((1, 1), np.float32)})
    assert out["OUTPUT0"].tolist() == [[1.0] * 4]
    with pytest.raises(InvalidArgument, match="configuration expects 1 inputs, model provides 2"):
        TensorFlowModel(_config("max_batch_size: 4 " + _io()), version, 1)


def test_thread_counts_after_the_runtime_started_are_a_warning(two_signatures, caplog):
    _ = tf.constant(1.0) + 1  # the runtime runs in this process from here on
    wanted = tf.config.threading.get_intra_op_parallelism_threads() + 5
    config = _config("max_batch_size: 4 " + _io() + _param("TF_NUM_INTRA_THREADS", str(wanted)))
    TensorFlowModel(config, two_signatures, 1)
    assert f"TF_NUM_INTRA_THREADS={wanted} not applied" in caplog.text
