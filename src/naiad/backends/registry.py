"""Backend name → implementation; heavy frameworks are imported only when a model needs them."""

from __future__ import annotations

import importlib

from naiad.backends.base import Model
from naiad.errors import InvalidArgument

_BACKENDS: dict[str, str] = {
    "custom": "naiad.backends.custom.backend:CustomModel",
    "identity": "naiad.backends.identity:IdentityModel",
    "llm": "naiad.backends.llm:LLMModel",
    "onnxruntime": "naiad.backends.onnxruntime:OnnxRuntimeModel",
    "openvino": "naiad.backends.openvino:OpenVinoModel",
    "python": "naiad.backends.python.backend:PythonModel",
    "pytorch": "naiad.backends.pytorch:PyTorchModel",
    "repeat": "naiad.backends.repeat:RepeatModel",
    "tensorflow": "naiad.backends.tensorflow:TensorFlowModel",
    "tensorrt": "naiad.backends.tensorrt:TensorRTModel",
}


def backend_class(name: str) -> type[Model]:
    """Import and return the Model class for backend `name`."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise InvalidArgument(f"unable to find backend '{name}'") from None
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[Model] = getattr(module, attr)
    return cls


def known_backends() -> list[str]:
    return sorted(_BACKENDS)
