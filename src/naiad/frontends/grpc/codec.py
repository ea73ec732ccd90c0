"""Triton's gRPC inference messages: ModelInferRequest → InferRequest, InferResponse →
ModelInferResponse.

Pure functions, no server. Inputs come from `raw_input_contents` (a zero-copy numpy view of
each bytes entry) or from typed `contents`, never both; outputs always go back in
`raw_output_contents`, as Triton answers and as tritonclient reads them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from naiad.errors import InvalidArgument
from naiad.frontends.grpc.contents import contents_array
from naiad.frontends.grpc.parameters import (
    decode_plain,
    decode_request_parameters,
    encode_parameters,
    parse_version,
)
from naiad.frontends.tensors import tensor_from_raw, tensor_to_raw
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

_DATATYPES = {dt.value: dt for dt in DataType}
_SHM_REGION = "shared_memory_region"
_NO_DATA = np.empty(0, dtype=np.uint8)  # placeholder for inputs read from shared memory later
_NO_OUTPUTS: frozenset[str] = frozenset()


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """Decode one request; InvalidArgument (with Triton's text) for anything malformed."""
    model_name = message.model_name
    version = parse_version(message.model_version)
    parameters = decode_request_parameters(message.parameters) if message.parameters else {}
    inputs = _decode_inputs(message.inputs, message.raw_input_contents, model_name)
    outputs = _decode_outputs(message.outputs) if message.outputs else None
    return InferRequest(model_name, version, inputs, outputs, message.id, parameters)


def _decode_inputs(items: Sequence[pb.ModelInferRequest.InferInputTensor], raw: Sequence[bytes],
                   model_name: str) -> list[Tensor]:
    tensors: list[Tensor] = []
    seen: set[str] = set()
    next_raw = 0
    for item in items:
        name = item.name
        if name in seen:
            raise InvalidArgument(f"input '{name}' already exists in request")
        seen.add(name)
        datatype = _DATATYPES.get(item.datatype)
        if datatype is None:
            raise InvalidArgument(f"invalid datatype for input {name}")
        shape = tuple(item.shape)
        parameters = decode_plain(item.parameters) if item.parameters else {}
        if _SHM_REGION in parameters:
            if item.HasField("contents"):
                raise InvalidArgument(f"unexpected 'content' provided when using shared memory for input tensor "
                                      f"'{name}' for model '{model_name}'")
            data = _NO_DATA
        elif item.HasField("contents"):
            if raw:
                raise InvalidArgument(f"contents field must not be specified when using raw_input_contents for "
                                      f"'{name}' for model '{model_name}'")
            data = contents_array(item.contents, name, datatype, shape, model_name)
        elif next_raw < len(raw):
            data = tensor_from_raw(name, datatype, shape, raw[next_raw], model_name)
            next_raw += 1
        else:
            raise InvalidArgument(f"unable to find data for input tensor '{name}' for model '{model_name}' in request.")
        tensors.append(Tensor(name, datatype, shape, data, parameters))
    if next_raw < len(raw):
        raise InvalidArgument(f"unexpected additional input data for model '{model_name}'")
    return tensors


def _decode_outputs(items: Sequence[pb.ModelInferRequest.InferRequestedOutputTensor]) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for item in items:
        name = item.name  # (each read of a protobuf field makes a new object: read once)
        if name in seen:
            raise InvalidArgument(f"output '{name}' already exists in request")
        seen.add(name)
        parameters: dict[str, Any] = {}
        given = item.parameters
        if given:
            parameters = decode_plain(given)
            if "classification" in given:
                _check_classification(given["classification"])
        outputs.append(RequestedOutput(name, parameters))
    return outputs


def _check_classification(parameter: pb.InferParameter) -> None:
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgument("invalid value type for 'classification' parameter, expected int64_param")
    if parameter.int64_param <= 0:
        raise InvalidArgument("invalid value for 'classification' parameter, expected >= 0")


def encode_infer_response(response: InferResponse,
                          in_shared_memory: Collection[str] = _NO_OUTPUTS) -> pb.ModelInferResponse:
    """A successful response; outputs named in `in_shared_memory` were written to shared memory
    and go back without data (an empty raw_output_contents entry). Callers handle errors."""
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                    id=response.id)
    if response.parameters:
        encode_parameters(message.parameters, response.parameters)
    raws: list[bytes] = []
    for tensor in response.outputs:
        # a DataType is its name (a str enum): no `.value`, an enum property lookup per output
        output = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if tensor.parameters:
            encode_parameters(output.parameters, tensor.parameters)
        if tensor.name in in_shared_memory:
            raws.append(b"")
        else:
            raw = tensor_to_raw(tensor.data, tensor.datatype)
            raws.append(raw if isinstance(raw, bytes) else raw.tobytes())
    message.raw_output_contents.extend(raws)
    return message
