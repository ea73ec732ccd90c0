"""KServe V2 inference requests, encoded once: HTTP/1.1 with the binary tensor extension, or a
gRPC `ModelInferRequest` with raw contents; tensors inline or in system shared memory."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tritonclient.grpc import service_pb2

from naiad.tools.loadgen.data import Entry, bytes_payload
from naiad.tools.loadgen.http1 import request_bytes


@dataclass(frozen=True, slots=True)
class ShmPlacement:
    """Where one request's tensors live in registered system shared memory regions."""

    inputs: dict[str, tuple[str, int, int]]  # input name -> (region, offset, byte_size)
    outputs: dict[str, tuple[str, int, int]]  # output name -> (region, offset, byte_size)


def _input_json(name: str, array: object, datatype: str, params: dict[str, object]) -> dict[str, object]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "parameters": params}  # type: ignore[attr-defined]


def http_infer(host: str, model: str, version: str, entry: Entry, datatypes: dict[str, str],
               outputs: list[str], shm: ShmPlacement | None = None,
               headers: dict[str, str] | None = None) -> bytes:
    """One `POST /v2/models/M[/versions/V]/infer` request, ready to write.

    Inline tensors go as binary data after the JSON header (`Inference-Header-Content-Length`);
    outputs are asked for as binary data too, as perf_analyzer does.
    """
    inputs, blobs = [], []
    for name, array in entry.items():
        if shm is not None:
            region, offset, size = shm.inputs[name]
            params: dict[str, object] = {"shared_memory_region": region, "shared_memory_offset": offset,
                                         "shared_memory_byte_size": size}
        else:
            blob = bytes_payload(array)
            blobs.append(blob)
            params = {"binary_data_size": len(blob)}
        inputs.append(_input_json(name, array, datatypes[name], params))
    wanted = []
    for name in outputs:
        if shm is not None:
            region, offset, size = shm.outputs[name]
            wanted.append({"name": name, "parameters": {"shared_memory_region": region,
                                                         "shared_memory_offset": offset,
                                                         "shared_memory_byte_size": size}})
        else:
            wanted.append({"name": name, "parameters": {"binary_data": True}})
    header = json.dumps({"inputs": inputs, "outputs": wanted}, separators=(",", ":")).encode()
    path = f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    hdrs = dict(headers or {})
    if blobs:
        hdrs["Content-Type"] = "application/octet-stream"
        hdrs["Inference-Header-Content-Length"] = str(len(header))
    else:
        hdrs["Content-Type"] = "application/json"
    return request_bytes("POST", host, path, header + b"".join(blobs), hdrs)


def grpc_infer(model: str, version: str, entry: Entry, datatypes: dict[str, str], outputs: list[str],
               shm: ShmPlacement | None = None) -> bytes:
    """One serialized `ModelInferRequest` (tensors as raw_input_contents, or in shared memory)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in entry.items():
        tensor = request.inputs.add(name=name, datatype=datatypes[name], shape=list(array.shape))
        if shm is not None:
            _shm_params(tensor.parameters, *shm.inputs[name])
        else:
            request.raw_input_contents.append(bytes_payload(array))
    for name in outputs:
        wanted = request.outputs.add(name=name)
        if shm is not None:
            _shm_params(wanted.parameters, *shm.outputs[name])
    return request.SerializeToString()


def _shm_params(params: object, region: str, offset: int, size: int) -> None:
    params["shared_memory_region"].string_param = region  # type: ignore[index]
    params["shared_memory_offset"].int64_param = offset  # type: ignore[index]
    params["shared_memory_byte_size"].int64_param = size  # type: ignore[index]
