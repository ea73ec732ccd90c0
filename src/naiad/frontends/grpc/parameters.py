"""gRPC parameters: InferParameter ↔ Python values, request-parameter rules and version strings.

Texts follow Triton's gRPC frontend (infer_handler.cc) so that clients matching on them keep
working; every error here is an InvalidArgument (INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.errors import InvalidArgument

#: The one `triton_` request parameter a client may set (Triton's TRITON_RESERVED_REQUEST_PARAMS).
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
_RESERVED = (EMPTY_FINAL_RESPONSE,)
_INT64_MAX = 2**63 - 1
_ANY_TYPE = "int64_param, bool_param, or string_param"


def parse_version(text: str) -> int | None:
    """A model_version string: "" leaves the choice to the version policy."""
    if not text:
        return None
    try:
        version = int(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0"
        ) from None
    if version < 0:
        raise InvalidArgument(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return version


def parameter_value(parameter: pb.InferParameter) -> Any:
    """The Python value of one InferParameter (None when no choice is set)."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def decode_plain(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """Tensor parameters (shared memory, classification...) as Python values, unchecked."""
    return {key: parameter_value(value) for key, value in parameters.items()}


def decode_request_parameters(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """Request parameters checked as Triton checks them; `triton_` keys are left out (the
    frontend reads them from the message itself)."""
    decoded: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        _check(key, choice, parameter)
        if not key.startswith("triton_"):
            decoded[key] = getattr(parameter, choice) if choice else None
    return decoded


def _check(key: str, choice: str | None, parameter: pb.InferParameter) -> None:
    expected = _EXPECTED.get(key)
    if expected is not None:
        names, wanted = expected
        if choice not in names:
            raise InvalidArgument(f"invalid value type for '{key}' parameter, expected {wanted}.")
        if key == "priority" and choice == "int64_param" and parameter.int64_param < 0:
            raise InvalidArgument("invalid value for 'priority', expected value >= 0.")
    elif key.startswith("triton_"):
        if key not in _RESERVED:
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                "keys starting with 'triton_' are allowed: " + " ".join(_RESERVED)
            )
        if choice != "bool_param":
            raise InvalidArgument(f"invalid value type for '{key}' parameter, expected bool_param.")
    elif choice not in ("int64_param", "bool_param", "string_param", "double_param"):
        raise InvalidArgument(f"invalid value type for '{key}' parameter, expected {_ANY_TYPE}.")


_EXPECTED: dict[str, tuple[tuple[str, ...], str]] = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
}


def empty_final_response(parameters: Mapping[str, pb.InferParameter]) -> bool:
    """Whether the client asked for flags-only (empty) final responses on the stream."""
    parameter = parameters.get(EMPTY_FINAL_RESPONSE)
    return parameter is not None and parameter.bool_param


def set_parameter(target: pb.InferParameter, value: Any) -> None:
    """Write one Python value into an InferParameter (numpy scalars included)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value > _INT64_MAX:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, bytes):
        target.string_param = value.decode("utf-8", "replace")
    else:
        target.string_param = str(value)


def encode_parameters(target: MutableMapping[str, pb.InferParameter], values: Mapping[str, Any]) -> None:
    """Fill a protobuf parameters map from a dict."""
    for key, value in values.items():
        set_parameter(target[key], value)
