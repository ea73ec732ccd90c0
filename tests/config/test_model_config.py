"""Reading, converting and describing ModelConfig messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.model_config import (
    ModelConfig,
    config_file_path,
    config_from_json,
    config_to_json,
    config_to_pbtxt,
    parse_config_text,
    read_model_config,
    tensor_specs,
)
from naiad.errors import InvalidArgument, Status
from naiad.types import DataType, TensorSpec

SIMPLE_PBTXT = """
name: "simple"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_model_config_is_tritons_generated_message():
    assert ModelConfig is pb.ModelConfig


def test_parse_simple_config():
    config = parse_config_text(SIMPLE_PBTXT, "simple/config.pbtxt")

    assert config.name == "simple"
    assert config.platform == "tensorflow_graphdef"
    assert config.max_batch_size == 8
    assert [io.name for io in config.input] == ["INPUT0", "INPUT1"]
    assert [io.name for io in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert all(io.data_type == pb.TYPE_INT32 and list(io.dims) == [16] for io in config.input)


def test_parse_error_names_source_and_position():
    with pytest.raises(InvalidArgument) as info:
        parse_config_text('name: "m"\nmax_batch_size: 8\nbogus_field: 1\n', "/repo/m/config.pbtxt")

    message = str(info.value)
    assert message.startswith("failed to read text proto from /repo/m/config.pbtxt")
    assert "3:1" in message
    assert "bogus_field" in message
    assert info.value.status is Status.INVALID_ARG


def test_config_file_path_prefers_selected_custom_config(tmp_path: Path):
    _write(tmp_path / "config.pbtxt", 'name: "m"')
    custom = _write(tmp_path / "configs" / "h100.pbtxt", 'name: "m"')

    assert config_file_path(tmp_path, "h100") == custom


def test_config_file_path_falls_back_to_config_pbtxt(tmp_path: Path):
    default = _write(tmp_path / "config.pbtxt", 'name: "m"')
    _write(tmp_path / "configs" / "h100.pbtxt", 'name: "m"')

    assert config_file_path(tmp_path, "a100") == default
    assert config_file_path(tmp_path, None) == default


def test_config_file_path_none_without_any_config(tmp_path: Path):
    assert config_file_path(tmp_path, None) is None
    assert config_file_path(tmp_path, "h100") is None


def test_read_model_config_reads_selected_file(tmp_path: Path):
    _write(tmp_path / "config.pbtxt", "max_batch_size: 8")
    _write(tmp_path / "configs" / "small.pbtxt", "max_batch_size: 2")

    assert read_model_config(tmp_path).max_batch_size == 8
    assert read_model_config(tmp_path, "small").max_batch_size == 2


def test_read_model_config_none_without_file(tmp_path: Path):
    assert read_model_config(tmp_path) is None


def test_read_model_config_parse_error_names_file(tmp_path: Path):
    path = _write(tmp_path / "config.pbtxt", "max_batch_size: eight")

    with pytest.raises(InvalidArgument, match=f"failed to read text proto from {path}"):
        read_model_config(tmp_path)


def test_json_prints_int64_as_numbers():
    config = parse_config_text(SIMPLE_PBTXT, "x")
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.version_policy.specific.versions.extend([1, 3])

    value = config_to_json(config)

    assert value["input"][0]["dims"] == [16]
    assert value["max_batch_size"] == 8
    assert value["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert value["version_policy"]["specific"]["versions"] == [1, 3]


def test_json_prints_defaults_and_enum_names():
    config = parse_config_text(SIMPLE_PBTXT, "x")
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)

    value = config_to_json(config)

    assert value["input"][0]["optional"] is False
    assert value["input"][0]["data_type"] == "TYPE_INT32"
    assert value["input"][0]["format"] == "FORMAT_NONE"
    assert value["instance_group"][0]["kind"] == "KIND_CPU"
    assert value["backend"] == ""
    assert value["model_warmup"] == []
    assert value["parameters"] == {}


def test_json_fixes_int64_inside_maps_and_repeated_messages():
    config = ModelConfig(name="m")
    policy = config.dynamic_batching.priority_queue_policy[2]
    policy.default_timeout_microseconds = 500
    warmup = config.model_warmup.add(name="w", batch_size=1)
    warmup.inputs["INPUT0"].dims.extend([4, 4])
    ensemble = ModelConfig(name="e", platform="ensemble")
    ensemble.ensemble_scheduling.step.add(model_name="a", model_version=-1)

    value = config_to_json(config)

    # JSON object keys are strings; the values inside are numbers.
    assert value["dynamic_batching"]["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 500
    assert value["model_warmup"][0]["inputs"]["INPUT0"]["dims"] == [4, 4]
    assert config_to_json(ensemble)["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_json_is_serialisable_and_keeps_field_order():
    value = config_to_json(parse_config_text(SIMPLE_PBTXT, "x"))

    assert json.loads(json.dumps(value)) == value
    assert list(value)[:4] == ["name", "platform", "backend", "runtime"]


def test_json_round_trip():
    config = parse_config_text(SIMPLE_PBTXT, "x")
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.instance_group.add(name="g", kind=pb.ModelInstanceGroup.KIND_CPU, count=2)

    assert config_from_json(json.dumps(config_to_json(config))) == config
    assert config_from_json(config_to_json(config)) == config


def test_config_from_json_accepts_bytes_and_partial_config():
    config = config_from_json(b'{"max_batch_size": 4, "input": [{"name": "X", "dims": [2, "3"]}]}')

    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [2, 3]


def test_config_from_json_rejects_bad_json():
    with pytest.raises(InvalidArgument, match="failed to parse model configuration JSON"):
        config_from_json('{"max_batch_size": ')


def test_config_from_json_rejects_unknown_field():
    with pytest.raises(InvalidArgument, match="no_such_field") as info:
        config_from_json({"no_such_field": 1})
    assert "Available Fields" not in str(info.value)


def test_config_from_json_rejects_non_object():
    with pytest.raises(InvalidArgument, match="expected a JSON object"):
        config_from_json("[1, 2]")


def test_pbtxt_round_trip():
    config = parse_config_text(SIMPLE_PBTXT, "x")
    config.dynamic_batching.priority_queue_policy[1].max_queue_size = 3
    config.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"

    text = config_to_pbtxt(config)

    assert parse_config_text(text, "round-trip") == config


def test_tensor_specs_batching_model_prepends_batch_dim():
    inputs, outputs = tensor_specs(parse_config_text(SIMPLE_PBTXT, "x"))

    assert inputs == [
        TensorSpec("INPUT0", DataType.INT32, (-1, 16)),
        TensorSpec("INPUT1", DataType.INT32, (-1, 16)),
    ]
    assert [spec.shape for spec in outputs] == [(-1, 16), (-1, 16)]


def test_tensor_specs_non_batching_model_uses_dims():
    config = parse_config_text(
        """
        max_batch_size: 0
        input { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] optional: true }
        output { name: "OUT" data_type: TYPE_FP32 dims: [ 2, 3 ] }
        """,
        "x",
    )

    inputs, outputs = tensor_specs(config)

    assert inputs == [TensorSpec("TEXT", DataType.BYTES, (-1,), optional=True)]
    assert outputs == [TensorSpec("OUT", DataType.FP32, (2, 3))]


def test_tensor_specs_ignore_reshape():
    config = parse_config_text(
        'max_batch_size: 4 input { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape { } }', "x"
    )

    inputs, _ = tensor_specs(config)

    assert inputs[0].shape == (-1, 1)


def test_tensor_specs_reject_invalid_data_type():
    config = parse_config_text('input { name: "X" dims: [ 1 ] }', "x")

    with pytest.raises(InvalidArgument, match="'X'"):
        tensor_specs(config)
