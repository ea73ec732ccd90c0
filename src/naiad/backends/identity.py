"""The "identity" backend: outputs are the inputs, no model file (like Triton's test backend).

Output i of the config echoes input i (matched by position, so names may differ). The config
parameter `execute_delay_ms` makes every execution take that long, which holds an instance busy
for tests of scheduling and for measuring the server without any framework cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.threaded import ThreadedInstance
from naiad.errors import InvalidArgument


class IdentityModel(Model):
    backend_name = "identity"

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        config = self.config
        if len(config.input) != len(config.output):
            raise InvalidArgument(f"model '{config.name}': the identity backend needs as many outputs as inputs")
        pairs = [(i.name, o.name) for i, o in zip(config.input, config.output, strict=True)]
        delay = config.parameters["execute_delay_ms"].string_value if "execute_delay_ms" in config.parameters else "0"
        try:
            delay_s = float(delay) / 1000
        except ValueError:
            raise InvalidArgument(f"model '{config.name}': execute_delay_ms must be a number, got '{delay}'") from None
        return IdentityInstance(pairs, delay_s)


class IdentityInstance(ThreadedInstance):
    def __init__(self, pairs: list[tuple[str, str]], delay_s: float) -> None:
        self.pairs = pairs
        self.delay_s = delay_s
        self.runs_anywhere = not delay_s  # numpy only, busy: unless it sleeps (execute_delay_ms)

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        if self.delay_s:
            time.sleep(self.delay_s)
        inputs = batch.inputs()
        return batch.split({out: inputs[name] for name, out in self.pairs if name in inputs})
