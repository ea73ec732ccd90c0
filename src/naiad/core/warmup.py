"""model_warmup: run the configured samples through every instance before the model is READY."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, ModelInstance
from naiad.backends.blocking import execute_blocking
from naiad.errors import InvalidArgument, Unavailable
from naiad.types import DataType, InferRequest, Tensor


def warmup_requests(config: mc.ModelConfig, model_dir: Path) -> list[tuple[str, int, InferRequest]]:
    """(sample name, repeat count, request) for each model_warmup entry."""
    batched = config.max_batch_size > 0
    samples = []
    for sample in config.model_warmup:
        batch = max(sample.batch_size, 1)
        tensors = [
            _tensor(name, spec, batch if batched else None, model_dir)
            for name, spec in sample.inputs.items()
        ]
        samples.append((sample.name, max(sample.count, 1), InferRequest(config.name, None, tensors)))
    return samples


def run_warmup(instance: ModelInstance, config: mc.ModelConfig, model_dir: Path) -> None:
    """Raise Unavailable naming the sample when any warm-up execution fails."""
    for name, count, request in warmup_requests(config, model_dir):
        for _ in range(count):
            (result,) = execute_blocking(instance, Batch([request], config.max_batch_size > 0))
            if isinstance(result, Exception):
                raise Unavailable(f"model '{config.name}' failed to warmup with sample '{name}': {result}")


def _tensor(name: str, spec: mc.ModelWarmup.Input, batch: int | None, model_dir: Path) -> Tensor:
    datatype = DataType.from_config(mc.DataType.Name(spec.data_type))
    shape = ((batch,) if batch is not None else ()) + tuple(spec.dims)
    count = int(np.prod(shape, dtype=np.int64))
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        raw = (model_dir / "warmup" / spec.input_data_file).read_bytes()
        data = _from_file(datatype, raw, count)
    elif source == "random_data":
        data = _random(datatype, count)
    else:
        data = np.zeros(count, dtype=datatype.numpy) if datatype is not DataType.BYTES else _empty_bytes(count)
    return Tensor(name, datatype, shape, data.reshape(shape))


def _from_file(datatype: DataType, raw: bytes, count: int) -> np.ndarray:
    if datatype is DataType.BYTES:
        return np.array([raw] * count, dtype=object)
    one = np.frombuffer(raw, dtype=datatype.numpy)
    if one.size == 0:
        raise InvalidArgument("warmup input data file is empty")
    return np.resize(one, count)


def _random(datatype: DataType, count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    if datatype is DataType.BYTES:
        return _empty_bytes(count)
    if datatype is DataType.BOOL:
        return rng.integers(0, 2, count).astype(np.bool_)
    if datatype.numpy.kind in "iu":
        return rng.integers(0, 100, count).astype(datatype.numpy)
    return rng.random(count).astype(datatype.numpy)


def _empty_bytes(count: int) -> np.ndarray:
    array = np.empty(count, dtype=object)
    array[:] = [b""] * count
    return array
