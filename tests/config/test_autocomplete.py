"""Backend resolution, defaults and I/O auto-complete."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.autocomplete import (
    DEFAULT_MODEL_FILENAMES,
    PLATFORM_BACKENDS,
    complete_io_from_model,
    fill_defaults,
    model_file_path,
    resolve_backend,
)
from naiad.config.model_config import ModelConfig, parse_config_text
from naiad.config.validate import validate_config
from naiad.errors import InvalidArgument
from naiad.types import DataType

KIND_CPU = pb.ModelInstanceGroup.KIND_CPU
KIND_GPU = pb.ModelInstanceGroup.KIND_GPU


def _model_dir(tmp_path: Path, name: str, files: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A model directory with version 1 holding `files` (path -> "file" or "dir")."""
    model_dir = tmp_path / name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    for path, kind in (files or {}).items():
        target = version_dir / path
        if kind == "dir":
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
    return model_dir, version_dir


# --- tables ----------------------------------------------------------------------------------


def test_default_model_filenames():
    assert DEFAULT_MODEL_FILENAMES["onnxruntime"] == "model.onnx"
    assert DEFAULT_MODEL_FILENAMES["pytorch"] == "model.pt"
    assert DEFAULT_MODEL_FILENAMES["tensorrt"] == "model.plan"
    assert DEFAULT_MODEL_FILENAMES["openvino"] == "model.xml"
    assert DEFAULT_MODEL_FILENAMES["python"] == "model.py"
    assert DEFAULT_MODEL_FILENAMES["dali"] == "model.dali"


def test_platform_backends():
    assert PLATFORM_BACKENDS["onnxruntime_onnx"] == "onnxruntime"
    assert PLATFORM_BACKENDS["tensorflow_graphdef"] == "tensorflow"
    assert PLATFORM_BACKENDS["ensemble"] == ""


# --- resolve_backend -------------------------------------------------------------------------


def test_resolve_from_onnx_file_in_first_version(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "densenet", {"model.onnx": "file"})
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)

    assert config.name == "densenet"
    assert config.backend == "onnxruntime"
    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "model.onnx"


def test_resolve_onnx_model_directory(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "big", {"model.onnx/model.onnx": "file"})
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == "onnxruntime"


@pytest.mark.parametrize(
    ("files", "backend", "platform", "filename"),
    [
        ({"model.pt": "file"}, "pytorch", "pytorch_libtorch", "model.pt"),
        ({"model.plan": "file"}, "tensorrt", "tensorrt_plan", "model.plan"),
        ({"model.xml": "file", "model.bin": "file"}, "openvino", "", "model.xml"),
        ({"model.py": "file"}, "python", "", "model.py"),
        ({"model.savedmodel": "dir"}, "tensorflow", "tensorflow_savedmodel", "model.savedmodel"),
        ({"model.graphdef": "file"}, "tensorflow", "tensorflow_graphdef", "model.graphdef"),
    ],
)
def test_resolve_from_default_files(
    tmp_path: Path, files: dict[str, str], backend: str, platform: str, filename: str
):
    model_dir, version_dir = _model_dir(tmp_path, "m", files)
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)

    assert (config.backend, config.platform, config.default_model_filename) == (backend, platform, filename)


def test_resolve_ignores_default_name_of_wrong_kind(tmp_path: Path):
    # model.pt must be a file and model.savedmodel a directory, as in Triton.
    model_dir, version_dir = _model_dir(tmp_path, "m", {"model.pt": "dir", "model.py": "file"})
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == "python"


def test_resolve_from_platform(tmp_path: Path):
    config = ModelConfig(platform="pytorch_libtorch")

    resolve_backend(config, tmp_path / "m", None)

    assert config.backend == "pytorch"
    assert config.default_model_filename == "model.pt"


def test_resolve_platform_from_backend(tmp_path: Path):
    config = ModelConfig(backend="onnxruntime")

    resolve_backend(config, tmp_path / "m", None)

    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "model.onnx"


def test_resolve_from_default_model_filename_extension(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "m", {"model.py": "file"})
    config = ModelConfig(default_model_filename="resnet50.onnx")

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == "onnxruntime"
    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "resnet50.onnx"


def test_resolve_from_default_model_filename_name(tmp_path: Path):
    config = ModelConfig(default_model_filename="model.plan")

    resolve_backend(config, tmp_path / "m", None)

    assert config.backend == "tensorrt"


def test_resolve_tensorflow_platform_from_files(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "m", {"model.graphdef": "file"})
    config = ModelConfig(backend="tensorflow")

    resolve_backend(config, model_dir, version_dir)

    assert config.platform == "tensorflow_graphdef"
    assert config.default_model_filename == "model.graphdef"


def test_resolve_keeps_consistent_fields(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "m", {"model.py": "file", "weights.onnx": "file"})
    config = ModelConfig(
        name="m", backend="onnxruntime", platform="onnxruntime_onnx", default_model_filename="weights.onnx"
    )
    before = ModelConfig()
    before.CopyFrom(config)

    resolve_backend(config, model_dir, version_dir)

    assert config == before


def test_resolve_keeps_explicit_backend_over_files(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "m", {"model.onnx": "file"})
    config = ModelConfig(backend="python")

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == "python"
    assert config.platform == ""
    assert config.default_model_filename == "model.py"


def test_resolve_custom_backend_from_model_name(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "mymodel.identity")
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == "identity"
    assert config.default_model_filename == "model.identity"


def test_resolve_uses_given_model_name(tmp_path: Path):
    config = ModelConfig(backend="python")

    resolve_backend(config, tmp_path / "tmp1234", None, model_name="real_name")

    assert config.name == "real_name"


def test_resolve_leaves_ensemble_without_backend(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "ens")
    config = ModelConfig(platform="ensemble")

    resolve_backend(config, model_dir, version_dir)

    assert config.backend == ""
    assert config.platform == "ensemble"


def test_resolve_fails_without_any_hint(tmp_path: Path):
    model_dir, version_dir = _model_dir(tmp_path, "mystery", {"weights.bin": "file"})

    with pytest.raises(InvalidArgument) as info:
        resolve_backend(ModelConfig(), model_dir, version_dir)

    assert str(info.value) == (
        "Invalid model name: Could not determine backend for model 'mystery' with no backend in model "
        "configuration. Expected model name of the form 'model.<backend_name>'."
    )


def test_resolve_fails_for_unknown_platform(tmp_path: Path):
    with pytest.raises(InvalidArgument, match="unexpected platform type 'caffe2_netdef' for m"):
        resolve_backend(ModelConfig(platform="caffe2_netdef"), tmp_path / "m", None)


def test_resolve_fails_for_unknown_default_filename(tmp_path: Path):
    with pytest.raises(InvalidArgument, match="unexpected platform type '' for m"):
        resolve_backend(ModelConfig(default_model_filename="weights.bin"), tmp_path / "m", None)


def test_model_file_path(tmp_path: Path):
    assert model_file_path(ModelConfig(backend="onnxruntime"), tmp_path) == tmp_path / "model.onnx"
    assert model_file_path(ModelConfig(backend="dali"), tmp_path) == tmp_path / "model.dali"
    assert model_file_path(ModelConfig(backend="identity"), tmp_path) == tmp_path / "model.identity"
    custom = ModelConfig(backend="onnxruntime", default_model_filename="net.onnx")
    assert model_file_path(custom, tmp_path) == tmp_path / "net.onnx"
    graphdef = ModelConfig(backend="tensorflow", platform="tensorflow_graphdef")
    assert model_file_path(graphdef, tmp_path) == tmp_path / "model.graphdef"


# --- fill_defaults ---------------------------------------------------------------------------


def test_fill_defaults_adds_one_group_named_after_model():
    config = ModelConfig(name="m", backend="python")

    fill_defaults(config)

    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    assert (group.name, group.kind, group.count) == ("m", KIND_CPU, 1)


def test_fill_defaults_uses_default_instance_count():
    config = ModelConfig(name="m", backend="python")

    fill_defaults(config, default_instance_count=3)

    assert config.instance_group[0].count == 3


def test_fill_defaults_two_cpu_instances_for_onnxruntime():
    config = ModelConfig(name="m", backend="onnxruntime")

    fill_defaults(config)

    assert config.instance_group[0].count == 2


def test_fill_defaults_names_groups_and_resolves_kind_auto():
    config = ModelConfig(name="m", backend="python")
    config.instance_group.add(count=4)
    config.instance_group.add(name="mine", kind=KIND_CPU)

    fill_defaults(config)

    first, second = config.instance_group
    assert (first.name, first.kind, first.count) == ("m_0", KIND_CPU, 4)
    assert (second.name, second.kind, second.count) == ("mine", KIND_CPU, 1)


def test_fill_defaults_kind_auto_to_gpu_when_available():
    config = ModelConfig(name="m", backend="pytorch")
    config.instance_group.add()

    fill_defaults(config, gpus_available=True, gpu_ids=[0, 1])

    group = config.instance_group[0]
    assert group.kind == KIND_GPU
    assert list(group.gpus) == [0, 1]
    assert group.count == 1


def test_fill_defaults_version_policy():
    config = ModelConfig(name="m", backend="python")

    fill_defaults(config)

    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1


def test_fill_defaults_keeps_version_policy():
    config = ModelConfig(name="m", backend="python")
    config.version_policy.all.SetInParent()

    fill_defaults(config)

    assert config.version_policy.WhichOneof("policy_choice") == "all"


def test_fill_defaults_dynamic_batching_only_when_asked():
    plain = ModelConfig(name="m", backend="onnxruntime", max_batch_size=4)
    asked = ModelConfig(name="m", backend="onnxruntime", max_batch_size=4)

    fill_defaults(plain)
    fill_defaults(asked, add_dynamic_batching=True)

    assert not plain.HasField("dynamic_batching")
    assert asked.HasField("dynamic_batching")
    assert list(asked.dynamic_batching.preferred_batch_size) == [4]


def test_fill_defaults_no_dynamic_batching_for_max_batch_size_one_or_scheduler():
    single = ModelConfig(name="m", backend="onnxruntime", max_batch_size=1)
    sequence = ModelConfig(name="m", backend="onnxruntime", max_batch_size=4)
    sequence.sequence_batching.SetInParent()

    fill_defaults(single, add_dynamic_batching=True)
    fill_defaults(sequence, add_dynamic_batching=True)

    assert single.WhichOneof("scheduling_choice") is None
    assert sequence.WhichOneof("scheduling_choice") == "sequence_batching"
    assert sequence.sequence_batching.max_sequence_idle_microseconds == 1_000_000


def test_fill_defaults_pinned_memory():
    config = ModelConfig(name="m", backend="python")
    config.optimization.output_pinned_memory.enable = False

    fill_defaults(config)

    assert config.optimization.input_pinned_memory.enable is True
    assert config.optimization.output_pinned_memory.enable is False


def test_fill_defaults_leaves_ensemble_groups_alone():
    config = ModelConfig(name="e", platform="ensemble")
    config.ensemble_scheduling.step.add(model_name="a")

    fill_defaults(config)

    assert len(config.instance_group) == 0
    assert not config.HasField("optimization")
    assert config.version_policy.latest.num_versions == 1


# --- complete_io_from_model ------------------------------------------------------------------

BATCHING_INPUTS = [("INPUT0", DataType.FP32, (-1, 3, 224, 224))]
BATCHING_OUTPUTS = [("OUTPUT0", DataType.FP32, (-1, 1000)), ("LABEL", DataType.INT64, (-1,))]


def test_complete_io_batching_model():
    config = ModelConfig(name="m", backend="onnxruntime")

    batches = complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)

    assert batches is True
    assert config.max_batch_size == 4
    assert [(io.name, io.data_type, list(io.dims)) for io in config.input] == [
        ("INPUT0", pb.TYPE_FP32, [3, 224, 224])
    ]
    output, label = config.output
    assert (output.name, list(output.dims), output.HasField("reshape")) == ("OUTPUT0", [1000], False)
    # A per-item scalar becomes dims [1] with an empty reshape.
    assert (label.data_type, list(label.dims), label.HasField("reshape")) == (pb.TYPE_INT64, [1], True)
    assert list(label.reshape.shape) == []


def test_complete_io_uses_default_max_batch_size():
    config = ModelConfig(name="m")

    complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS, default_max_batch_size=16)

    assert config.max_batch_size == 16


def test_complete_io_non_batching_model():
    config = ModelConfig(name="m")

    batches = complete_io_from_model(
        config, [("X", DataType.INT32, (2, -1))], [("Y", DataType.BYTES, (2,)), ("S", DataType.FP32, ())]
    )

    assert batches is False
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [2, -1]
    assert config.output[0].data_type == pb.TYPE_STRING
    scalar = config.output[1]
    assert (list(scalar.dims), scalar.HasField("reshape")) == ([1], False)


def test_complete_io_keeps_listed_tensors_and_fills_gaps():
    config = parse_config_text(
        """
        name: "m"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP16 dims: [ 3, -1, -1 ] } ]
        output [ { name: "OUTPUT0" } ]
        """,
        "x",
    )

    complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)

    assert config.max_batch_size == 8
    assert (config.input[0].data_type, list(config.input[0].dims)) == (pb.TYPE_FP16, [3, -1, -1])
    # The config lists its outputs: LABEL is not added, OUTPUT0 gets what it lacks.
    assert [io.name for io in config.output] == ["OUTPUT0"]
    assert (config.output[0].data_type, list(config.output[0].dims)) == (pb.TYPE_FP32, [1000])


def test_complete_io_fills_missing_outputs_only():
    config = parse_config_text(
        'name: "m" input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]', "x"
    )

    complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)

    assert config.max_batch_size == 4
    assert [io.name for io in config.output] == ["OUTPUT0", "LABEL"]
    assert list(config.input[0].dims) == [3, 224, 224]


def test_complete_io_full_rank_dims_keep_model_non_batching():
    config = parse_config_text(
        'name: "m" input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 3, 224, 224 ] } ]', "x"
    )

    batches = complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)

    assert batches is True
    assert config.max_batch_size == 0
    assert list(config.output[0].dims) == [-1, 1000]


def test_complete_io_does_not_change_batching_when_config_lists_all():
    config = parse_config_text(
        """
        name: "m"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 3, 224, 224 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 1000 ] } ]
        """,
        "x",
    )

    batches = complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)

    assert batches is False
    assert config.max_batch_size == 0


def test_complete_io_rejects_max_batch_size_for_non_batching_model():
    config = ModelConfig(name="m", max_batch_size=8)

    with pytest.raises(InvalidArgument) as info:
        complete_io_from_model(config, [("X", DataType.FP32, (1, 4))], [("Y", DataType.FP32, (1, 4))])

    assert str(info.value) == (
        "autofill failed for model 'm': model does not support batching while non-zero max_batch_size "
        "is specified"
    )


def test_auto_completed_onnx_model_validates(tmp_path: Path):
    """The stages in the core's order produce a loadable config."""
    model_dir, version_dir = _model_dir(tmp_path, "resnet", {"model.onnx": "file"})
    config = ModelConfig()

    resolve_backend(config, model_dir, version_dir)
    batches = complete_io_from_model(config, BATCHING_INPUTS, BATCHING_OUTPUTS)
    fill_defaults(config, add_dynamic_batching=batches)

    validate_config(config, "resnet")
    assert config.dynamic_batching.preferred_batch_size == [4]
    assert (config.instance_group[0].name, config.instance_group[0].count) == ("resnet", 2)
