"""Ensemble models (platform "ensemble") as the core serves them.

An ensemble has no backend of its own: its one instance answers later, running each request's
steps (scheduling.ensemble.EnsembleRun) as requests to the composing models through the server,
so every step is validated, queued, batched, counted and traced by its own model as any other
request. The ensemble's own statistics cover the whole run.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, BatchSender, ExecutionTimes, Model, ModelInstance, Outputs
from naiad.errors import InvalidArgument, Unavailable
from naiad.scheduling.base import ResponseSink
from naiad.scheduling.ensemble import EnsemblePlan, EnsembleRun
from naiad.types import InferRequest

ENSEMBLE_PLATFORM = "ensemble"


class EnsembleModel(Model):
    backend_name = ""

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.plan = EnsemblePlan.from_config(config)

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        return EnsembleInstance(self)


class EnsembleInstance(ModelInstance):
    """Runs each request's steps through the server; it always has room (its steps queue at
    their own models), and a batch's "execution" is the whole run of its steps."""

    depth = 1 << 30
    failure_reason = "OTHER"  # as Triton counts a failed ensemble (its step counts its own reason)

    def __init__(self, model: EnsembleModel) -> None:
        self.model = model

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        host = self.model.host
        if host is None:
            raise Unavailable(f"ensemble '{self.model.plan.name}' is not attached to a server")
        started = time.monotonic_ns()
        remaining = [len(batch.requests)]
        lock = threading.Lock()

        def submit(request: InferRequest, sink: ResponseSink) -> Callable[[], None]:
            return host.submit(request, sink, decoupled=True)

        for index, request in enumerate(batch.requests):

            def emit(result: Outputs | Exception | None, final: bool, index: int = index) -> None:
                if final:
                    with lock:
                        remaining[0] -= 1
                        last = remaining[0] == 0
                    if last:
                        now = time.monotonic_ns()
                        sender.executed(ExecutionTimes(started, started, now, now))
                sender.send(index, result, final)

            EnsembleRun(self.model.plan, request, submit, emit,
                        is_cancelled=functools.partial(batch.is_cancelled, index),
                        on_child=_child_of(request)).start()
        return True


def _child_of(parent: InferRequest) -> Callable[[InferRequest], None] | None:
    """Joins each step's request to the ensemble request's trace, when it is traced."""
    if parent.trace is None:
        return None

    def join(child: InferRequest) -> None:
        child.trace_parent = parent.trace

    return join


def check_steps(config: mc.ModelConfig, composing: dict[int, mc.ModelConfig]) -> None:
    """Each step's maps name real inputs and outputs of its model, every required input of the
    model is fed, and each ensemble tensor has one data type wherever it is written or read.
    `composing` is the serving config of each step's model, by step index."""
    name = config.name
    types: dict[str, tuple[int, str]] = {t.name: (t.data_type, f"ensemble input '{t.name}'") for t in config.input}
    steps = config.ensemble_scheduling.step
    for index, step in enumerate(steps):
        model = composing[index]
        outputs = {o.name: o.data_type for o in model.output}
        for output, tensor in step.output_map.items():
            if output not in outputs:
                raise InvalidArgument(f"in ensemble {name}, step {index}: model '{step.model_name}' has no output "
                                      f"'{output}'")
            types.setdefault(tensor, (outputs[output], f"output '{output}' of model '{step.model_name}'"))
    for output in config.output:
        _same_type(name, output.name, output.data_type, f"ensemble output '{output.name}'", types)
    for index, step in enumerate(steps):
        model = composing[index]
        inputs = {i.name: i for i in model.input}
        for model_input, tensor in step.input_map.items():
            spec = inputs.get(model_input)
            if spec is None:
                raise InvalidArgument(f"in ensemble {name}, step {index}: model '{step.model_name}' has no input "
                                      f"'{model_input}'")
            _same_type(name, tensor, spec.data_type, f"input '{model_input}' of model '{step.model_name}'", types)
        missing = sorted(i for i, spec in inputs.items() if i not in step.input_map and not spec.optional)
        if missing:
            raise InvalidArgument(f"in ensemble {name}, step {index}: input(s) {', '.join(missing)} of model "
                                  f"'{step.model_name}' are not mapped")


def _same_type(ensemble: str, tensor: str, data_type: int, reader: str, types: dict[str, tuple[int, str]]) -> None:
    known = types.get(tensor)
    if known is not None and known[0] != data_type:
        raise InvalidArgument(
            f"in ensemble {ensemble}, ensemble tensor '{tensor}' is {mc.DataType.Name(known[0])} as {known[1]} "
            f"but {mc.DataType.Name(data_type)} as {reader}")
