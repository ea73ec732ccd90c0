"""The "custom" backend: a shared library implementing naiad_backend.h, one model process per instance.

It is the Python backend with a fixed model.py (`runner/model.py`) that loads the library with
ctypes: the same process, shared memory, protocol and restart on a crash. What differs is said
here: where the library is, what the ABI cannot carry (BYTES, BF16, decoupled models), and the
error a crash gives the requests it took down.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Model, ModelInstance
from naiad.backends.python.backend import _KINDS, PythonInstance, PythonModel, _stub_timeout
from naiad.config.autocomplete import model_file_path
from naiad.config.model_config import config_to_json
from naiad.errors import InternalError, InvalidArgument, NaiadError

RUNNER = Path(__file__).parent / "runner" / "model.py"
_UNSUPPORTED = {mc.TYPE_STRING: "BYTES", mc.TYPE_BF16: "BF16"}


class CustomModel(PythonModel):
    backend_name = "custom"

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        Model.__init__(self, config, version_dir, version)
        self.library = model_file_path(config, version_dir)  # model.so unless default_model_filename says
        if not self.library.is_file():
            raise InvalidArgument(f"unable to find custom backend library '{self.library}' for model "
                                  f"'{config.name}'")
        if config.model_transaction_policy.decoupled:
            raise InvalidArgument(f"model '{config.name}': the custom backend does not support decoupled models")
        for kind, tensors in (("input", config.input), ("output", config.output)):
            for tensor in tensors:
                if tensor.data_type in _UNSUPPORTED:
                    raise InvalidArgument(
                        f"model '{config.name}': {kind} '{tensor.name}' is {_UNSUPPORTED[tensor.data_type]}, "
                        "which the custom backend's C ABI (version 1) does not carry")
        self.model_file = RUNNER  # what the model process loads: it opens the library
        self.model_dir = version_dir.parent
        self._indices = itertools.count()  # create()'s instance_index, over all groups

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        return False  # the ABI has no auto-complete: the config declares inputs and outputs

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        name = f"{group.name}_{index}"
        args = {
            "model_config": json.dumps(config_to_json(self.config)),
            "model_instance_kind": _KINDS.get(group.kind, "CPU"),
            "model_instance_name": name,
            "model_instance_device_id": str(group.gpus[index % len(group.gpus)] if group.gpus else 0),
            "model_repository": str(self.model_dir),
            "model_version": str(self.version),
            "model_name": self.config.name,
            "custom_library": str(self.library.resolve()),
            "custom_instance_index": str(next(self._indices)),
        }
        return CustomInstance(self, name, args, _stub_timeout(dict(self.backend_settings())))

    def backend_settings(self) -> Mapping[str, str]:
        return self.host.backend_config("custom") if self.host is not None else {}


class CustomInstance(PythonInstance):
    def _start(self) -> None:
        try:
            super()._start()
        except InternalError as error:  # create() refused, or the library cannot be used
            raise InternalError(f"custom backend library of model '{self.model.config.name}': {error}") from None

    def _exit_error(self, code: int | None) -> NaiadError:
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited (code {code})" if code is not None else "exited"
        return InternalError(f"Failed to process the request(s) for model instance '{self.name}', message: "
                             f"the custom backend's model process {how}; a new one is starting")
