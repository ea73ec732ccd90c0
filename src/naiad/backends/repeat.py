"""The "repeat" backend: a decoupled model with no model file, like Triton's test backend.

For a request with IN = [v0, v1, ...] it sends one response per element, OUT = [vi] and
IDX = [i], waiting DELAY[i] milliseconds before each when DELAY is given, then a flags-only
final response. It exists to exercise streaming end to end (gRPC ModelStreamInfer, HTTP
generate_stream) without a framework; a zero-length IN gives only the final response.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.threaded import Send, ThreadedInstance
from naiad.errors import InvalidArgument


class RepeatModel(Model):
    backend_name = "repeat"

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        if not self.config.model_transaction_policy.decoupled:
            raise InvalidArgument(f"model '{self.config.name}': the repeat backend needs "
                                  "model_transaction_policy { decoupled: true }")
        return RepeatInstance()


class RepeatInstance(ThreadedInstance):
    decoupled = True

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        raise InvalidArgument("the repeat backend only serves decoupled models")

    def execute_decoupled(self, batch: Batch, send: Send) -> None:
        for index, request in enumerate(batch.requests):
            inputs = {tensor.name: tensor.data for tensor in request.inputs}
            values = inputs["IN"].reshape(-1)
            delays = inputs.get("DELAY", np.zeros(values.size, dtype=np.uint32)).reshape(-1)
            if delays.size < values.size:
                send(index, InvalidArgument("DELAY must have as many elements as IN"), True)
                continue
            for i, value in enumerate(values):
                if delays[i]:
                    time.sleep(int(delays[i]) / 1000)
                send(index, {"OUT": np.array([value], dtype=np.int32),
                             "IDX": np.array([i], dtype=np.uint32)}, False)
            send(index, None, True)
