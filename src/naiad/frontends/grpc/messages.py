"""The core's protocol-neutral answers (dicts, lists) as GRPCInferenceService messages, and the
repository / logging request messages as the core's arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from naiad.core.server import Region
from naiad.errors import InvalidArgument


def server_metadata(metadata: dict[str, Any]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=metadata["name"], version=metadata["version"],
                                     extensions=metadata["extensions"])


def model_metadata(metadata: dict[str, Any]) -> pb.ModelMetadataResponse:
    return json_format.ParseDict(metadata, pb.ModelMetadataResponse())


def statistics(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    # Same field names as the HTTP JSON (SPEC §6); protobuf leaves zero counts out on the wire.
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse())


def repository_index(entries: list[dict[str, Any]]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries])


def repository_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> dict[str, Any]:
    """Load / unload parameters: `config` a JSON string, `file:<path>` raw bytes, others as given."""
    decoded: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if key == "config" and choice != "string_param":
            raise InvalidArgument("'config' parameter must be a JSON string (string_param)")
        if key.startswith("file:") and choice != "bytes_param":
            raise InvalidArgument(f"file parameter '{key}' must be bytes_param")
        decoded[key] = getattr(parameter, choice) if choice else None
    return decoded


def log_changes(settings: Mapping[str, pb.LogSettingsRequest.SettingValue]) -> dict[str, Any]:
    """LogSettings request values as Python values (None for a value with no type set)."""
    changes: dict[str, Any] = {}
    for key, value in settings.items():
        choice = value.WhichOneof("parameter_choice")
        changes[key] = getattr(value, choice) if choice else None
    return changes


def trace_changes(settings: Mapping[str, pb.TraceSettingRequest.SettingValue]) -> dict[str, Any]:
    """TraceSetting request values as the HTTP API's JSON: trace_level a list, the others a string;
    an empty value list clears a model's setting (None)."""
    return {key: (list(value.value) if key == "trace_level" else value.value[0]) if value.value else None
            for key, value in settings.items()}


def trace_settings(values: dict[str, Any]) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    for key, value in values.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
    return response


def log_settings(values: dict[str, Any]) -> pb.LogSettingsResponse:
    """bool settings as bool_param, numbers as uint32_param, text as string_param (SPEC §1.12)."""
    response = pb.LogSettingsResponse()
    for key, value in values.items():
        setting = response.settings[key]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int):
            setting.uint32_param = value
        else:
            setting.string_param = str(value)
    return response


def shm_status(regions: list[Region]) -> pb.SystemSharedMemoryStatusResponse:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
            name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size))
    return response


def cuda_status(regions: list[dict[str, Any]]) -> pb.CudaSharedMemoryStatusResponse:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region["name"]].CopyFrom(
            json_format.ParseDict(region, pb.CudaSharedMemoryStatusResponse.RegionStatus()))
    return response
