"""Turn a backend's output arrays into an InferResponse: requested outputs, reshape, classification."""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.errors import InternalError, InvalidArgument
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec

_MAX_CLASSIFICATION_ELEMENTS = 1_000_000


class ResponseBuilder:
    """Builds responses for one model version; built once at load time."""

    def __init__(self, model_name: str, version: str, outputs: list[TensorSpec], batched: bool,
                 labels: dict[str, list[str]]) -> None:
        self.model_name = model_name
        self.version = version
        self.outputs = {spec.name: spec for spec in outputs}
        self.all_outputs = [RequestedOutput(spec.name) for spec in outputs]
        self.batched = batched
        self.labels = labels

    def error(self, request: InferRequest, error: Exception) -> InferResponse:
        return InferResponse(self.model_name, self.version, request.id, error=error)

    def build(self, request: InferRequest, arrays: dict[str, np.ndarray]) -> InferResponse:
        tensors = []
        for requested in request.outputs or self.all_outputs:
            array = arrays.get(requested.name)
            if array is None:
                raise InternalError(
                    f"output '{requested.name}' was not produced by model '{self.model_name}'"
                )
            tensors.append(self._tensor(requested, array))
        response = InferResponse(self.model_name, self.version, request.id, tensors)
        parameters = getattr(arrays, "parameters", None)  # ParameterizedOutputs
        if parameters:
            response.parameters = parameters
        return response

    def _tensor(self, requested: RequestedOutput, array: np.ndarray) -> Tensor:
        spec = self.outputs[requested.name]
        # A config `reshape` means the model's shape differs from the one clients see.
        dims = spec.shape[1:] if self.batched else spec.shape
        if len(dims) != array.ndim - (1 if self.batched else 0):
            array = array.reshape(((array.shape[0],) if self.batched else ()) + tuple(dims))
        # The requested output's parameters are instructions, not output parameters: Triton
        # answers with none of them (only binary_data_size, which the frontend adds).
        class_count = requested.parameters.get("classification")
        if class_count:
            array = self._classify(spec, array, int(class_count))
            return Tensor(spec.name, DataType.BYTES, array.shape, array)
        return Tensor(spec.name, spec.datatype, array.shape, array)

    def _classify(self, spec: TensorSpec, array: np.ndarray, count: int) -> np.ndarray:
        if spec.datatype is DataType.BYTES:
            raise InvalidArgument(
                "class result not available for output due to unsupported type 'BYTES'"
            )
        if array.size > _MAX_CLASSIFICATION_ELEMENTS:
            raise InvalidArgument("classification output tensor too large")
        values = _as_float(spec.datatype, array)
        rows = values.reshape(values.shape[0], -1) if self.batched else values.reshape(1, -1)
        labels = self.labels.get(spec.name, [])
        result = np.array([_top_k(row, count, labels) for row in rows], dtype=object)
        return result if self.batched else result[0]


def _as_float(datatype: DataType, array: np.ndarray) -> np.ndarray:
    if datatype is DataType.BF16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float64)


def _top_k(row: np.ndarray, count: int, labels: list[str]) -> list[Any]:
    count = min(count, row.size)
    order = np.argsort(-row, kind="stable")[:count]
    out = []
    for index in order:
        text = f"{float(row[index]):.6f}:{index}"
        if index < len(labels):
            text += f":{labels[index]}"
        out.append(text.encode())
    return out
