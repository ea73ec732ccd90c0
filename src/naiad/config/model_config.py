"""Model configuration: read config.pbtxt / JSON into Triton's own `ModelConfig` protobuf.

The schema is `tritonclient.grpc.model_config_pb2`, never a hand-kept copy. This module only
moves configs between text, JSON and the message; auto-complete and validation live beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from naiad.errors import InvalidArgument
from naiad.types import DataType, TensorSpec

ModelConfig: TypeAlias = model_config_pb2.ModelConfig  # tritonclient ships no stubs: Any to mypy

CONFIG_FILENAME = "config.pbtxt"
CUSTOM_CONFIG_DIR = "configs"

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse text-format `text` into a ModelConfig; `source` names it in the error message."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise InvalidArgument(f"failed to read text proto from {source}: {e}") from None
    return config


def config_file_path(model_dir: Path, config_name: str | None) -> Path | None:
    """The config file to read: `configs/<config_name>.pbtxt` when it exists, else `config.pbtxt`.

    None when neither exists (auto-complete may still derive a config).
    """
    if config_name:
        custom = model_dir / CUSTOM_CONFIG_DIR / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    default = model_dir / CONFIG_FILENAME
    return default if default.is_file() else None


def read_model_config(model_dir: Path, config_name: str | None = None) -> ModelConfig | None:
    """Read the model's config file (see `config_file_path`); None when the model has none."""
    path = config_file_path(model_dir, config_name)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"failed to read text proto from {path}: {e}") from None
    return parse_config_text(text, str(path))


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """Triton's /config JSON: proto field names, every no-presence field printed (defaults
    included), enums by name, and 64-bit integers as JSON numbers (protobuf prints them as
    strings). Map keys stay strings, as JSON requires and as Triton does."""
    raw = json_format.MessageToDict(
        config,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
    )
    return _fix_message(raw, config.DESCRIPTOR)


def _fix_message(value: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    # Rebuilt in declaration order so the JSON reads like Triton's (which prints in field order).
    fixed: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name in value:
            fixed[field.name] = _fix_field(value[field.name], field)
    return fixed


def _fix_field(value: Any, field: FieldDescriptor) -> Any:
    if _is_map(field):
        value_field = field.message_type.fields_by_name["value"]
        return {key: _fix_single(item, value_field) for key, item in value.items()}
    if _is_repeated(field):
        return [_fix_single(item, field) for item in value]
    return _fix_single(value, field)


def _fix_single(value: Any, field: FieldDescriptor) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _fix_message(value, field.message_type)
    if field.type in _INT64_TYPES:
        return int(value)
    return value


def _is_map(field: FieldDescriptor) -> bool:
    return (
        field.type == FieldDescriptor.TYPE_MESSAGE
        and _is_repeated(field)
        and field.message_type.GetOptions().map_entry
    )


def _is_repeated(field: FieldDescriptor) -> bool:
    # `label` is deprecated in protobuf 6; `is_repeated` does not exist in older releases.
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)
    return bool(is_repeated)


def config_from_json(value: str | bytes | dict[str, Any]) -> ModelConfig:
    """Parse a JSON ModelConfig (the repository-load `config` override).

    Accepts what `config_to_json` writes (64-bit integers as numbers or strings).
    """
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"failed to parse model configuration JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("failed to parse model configuration JSON: expected a JSON object")
    config = ModelConfig()
    try:
        json_format.ParseDict(value, config)
    except json_format.ParseError as e:
        # protobuf appends the list of every available field; the first line says what is wrong.
        detail = str(e).splitlines()[0]
        raise InvalidArgument(f"failed to parse model configuration JSON: {detail}") from None
    return config


def config_to_pbtxt(config: ModelConfig) -> str:
    """Text-format config.pbtxt that parses back to an equal message."""
    return str(text_format.MessageToString(config))


def tensor_specs(config: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs as clients see them (shape `[-1] + dims` when the model batches).

    `reshape` is the model-side shape and does not change what clients see.
    """
    batch = [-1] if config.max_batch_size > 0 else []
    inputs = [
        TensorSpec(io.name, _datatype(io.data_type, io.name), tuple(batch + list(io.dims)), io.optional)
        for io in config.input
    ]
    outputs = [
        TensorSpec(io.name, _datatype(io.data_type, io.name), tuple(batch + list(io.dims)))
        for io in config.output
    ]
    return inputs, outputs


def _datatype(data_type: int, tensor_name: str) -> DataType:
    try:
        return DataType.from_config(model_config_pb2.DataType.Name(data_type))
    except ValueError:
        raise InvalidArgument(f"tensor '{tensor_name}' has invalid data_type {data_type}") from None
