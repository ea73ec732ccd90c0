"""What a model takes and returns, read from the config the server serves (`/v2/models/M/config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from naiad.config.model_config import ModelConfig, tensor_specs
from naiad.types import DataType


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output: its dims as the config gives them (no batch dimension; -1 = any)."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The served model, as a client needs it to build requests."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    decoupled: bool = False
    backend: str = ""
    platform: str = ""

    @property
    def is_llm(self) -> bool:
        """naiad's LLM backend (or any decoupled model that streams text): driven by `llm.py`."""
        return self.backend in ("llm", "vllm")

    def tensor(self, name: str) -> TensorInfo:
        for info in self.inputs:
            if info.name == name:
                return info
        raise KeyError(name)


def config_message(config_json: dict[str, Any]) -> ModelConfig:
    """The served config as a ModelConfig; fields this tritonclient does not know are skipped."""
    config = ModelConfig()
    json_format.ParseDict(config_json, config, ignore_unknown_fields=True)
    return config


def spec_from_config(config_json: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from the JSON of `GET /v2/models/M/config` (or gRPC ModelConfig as a dict)."""
    config = config_message(config_json)
    inputs, outputs = tensor_specs(config)
    strip = 1 if config.max_batch_size > 0 else 0  # tensor_specs puts the batch dim first

    def info(spec: Any) -> TensorInfo:
        return TensorInfo(spec.name, spec.datatype, tuple(spec.shape[strip:]), getattr(spec, "optional", False))

    return ModelSpec(
        name=config.name,
        max_batch_size=config.max_batch_size,
        inputs=tuple(info(s) for s in inputs),
        outputs=tuple(info(s) for s in outputs),
        decoupled=config.model_transaction_policy.decoupled,
        backend=config.backend,
        platform=config.platform,
    )
