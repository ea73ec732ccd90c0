"""Ensembles: a DAG of model steps run as one request (Triton's `ensemble_scheduling`).

An `EnsemblePlan` is the config's steps, read once. An `EnsembleRun` carries one request
through it: each step starts as soon as every one of its inputs exists, so independent branches
run concurrently, and only the steps that lead to the requested outputs run at all. Steps are
started through a `submit` callable the core hands in (this module never imports the core), and
tensors pass from step to step as the same arrays (no copies).

Decoupled steps may answer several times. The first answer of a step that is also its final
one fills the run's tensors in place; any other answer with outputs opens a branch of its own
(a child `_Scope` that sees its parent's tensors), so what follows such a step runs once per
answer, and the ensemble answers once per branch that completes its outputs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from naiad.errors import Cancelled, InternalError, NaiadError
from naiad.scheduling.base import ResponseSink
from naiad.types import InferRequest, InferResponse, RequestedOutput, Tensor

#: start one step's request; its responses reach the sink (from any thread); returns a canceller
Submit = Callable[[InferRequest, ResponseSink], Callable[[], None]]
#: answer the ensemble's request: outputs (or an error, or None for flags only) and whether final
Emit = Callable[[dict[str, Any] | Exception | None, bool], None]


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model_name: str
    model_version: int | None  # None: the version policy's latest (config -1)
    inputs: tuple[tuple[str, str], ...]  # (the step model's input, the ensemble tensor feeding it)
    outputs: tuple[tuple[str, str], ...]  # (the step model's output, the ensemble tensor it writes)

    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


class EnsemblePlan:
    """The steps of one ensemble config, and which of them each set of requested outputs needs."""

    def __init__(self, name: str, steps: list[Step], inputs: list[str], outputs: list[str],
                 max_inflight: int = 0) -> None:
        self.name = name
        self.steps = steps
        self.inputs = frozenset(inputs)
        self.outputs = tuple(outputs)
        self.max_inflight = max_inflight  # step requests in flight per ensemble request; 0 = no limit
        self.producer = {tensor: step for step in steps for _, tensor in step.outputs}
        self._needed: dict[frozenset[str], tuple[Step, ...]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any) -> EnsemblePlan:
        """From a ModelConfig with `ensemble_scheduling` (validated already)."""
        steps = [
            Step(index, step.model_name, step.model_version if step.model_version > 0 else None,
                 tuple(sorted(step.input_map.items())), tuple(sorted(step.output_map.items())))
            for index, step in enumerate(config.ensemble_scheduling.step)
        ]
        return cls(config.name, steps, [i.name for i in config.input], [o.name for o in config.output],
                   config.ensemble_scheduling.max_inflight_requests)

    def needed(self, wanted: frozenset[str]) -> tuple[Step, ...]:
        """The steps that lead to the `wanted` ensemble outputs, in config order (cached)."""
        steps = self._needed.get(wanted)
        if steps is None:
            chosen: set[int] = set()
            pending = list(wanted)
            while pending:
                step = self.producer.get(pending.pop())
                if step is None or step.index in chosen:
                    continue
                chosen.add(step.index)
                pending.extend(tensor for _, tensor in step.inputs)
            steps = tuple(s for s in self.steps if s.index in chosen)
            with self._lock:
                self._needed[wanted] = steps
        return steps

    def composing_models(self) -> list[tuple[str, int | None]]:
        return [(step.model_name, step.model_version) for step in self.steps]


class _Scope:
    """The tensors one branch of a run sees: its own, then its parent's."""

    __slots__ = ("children", "emitted", "parent", "started", "tensors")

    def __init__(self, parent: _Scope | None) -> None:
        self.parent = parent
        self.tensors: dict[str, Tensor] = {}
        self.started: set[int] = set()  # steps started in this scope
        self.children: list[_Scope] = []
        self.emitted = False

    def find(self, name: str) -> Tensor | None:
        scope: _Scope | None = self
        while scope is not None:
            tensor = scope.tensors.get(name)
            if tensor is not None:
                return tensor
            scope = scope.parent
        return None

    def started_above(self, index: int) -> bool:
        scope: _Scope | None = self
        while scope is not None:
            if index in scope.started:
                return True
            scope = scope.parent
        return False

    def emitted_above(self) -> bool:
        scope: _Scope | None = self
        while scope is not None:
            if scope.emitted:
                return True
            scope = scope.parent
        return False

    def descendants(self) -> list[_Scope]:
        found, pending = [], [self]
        while pending:
            scope = pending.pop()
            found.append(scope)
            pending.extend(scope.children)
        return found


class EnsembleRun:
    """One request's way through the steps; answers through `emit`, the last answer final."""

    def __init__(self, plan: EnsemblePlan, request: InferRequest, submit: Submit, emit: Emit,
                 is_cancelled: Callable[[], bool] = lambda: False,
                 on_child: Callable[[InferRequest], None] | None = None) -> None:
        self.plan = plan
        self.request = request
        self.submit = submit
        self.emit = emit
        self.is_cancelled = is_cancelled
        self.on_child = on_child  # sets up each step's request (the core joins it to the trace)
        names = [o.name for o in request.outputs] if request.outputs else list(plan.outputs)
        self.wanted = tuple(names)
        self.steps = plan.needed(frozenset(names))
        self.absent = plan.inputs - {t.name for t in request.inputs}  # optional inputs not sent
        self.root = _Scope(None)
        self.root.tensors = {t.name: t for t in request.inputs}
        self._lock = threading.Lock()
        self._inflight = 0
        self._waiting: collections.deque[tuple[Step, _Scope]] = collections.deque()
        self._cancellers: dict[int, Callable[[], None]] = {}
        self._held: dict[str, Any] | None = None  # the last answer, sent once the next one is known
        self._done = False

    def start(self) -> None:
        with self._lock:
            ready = self._ready(self.root)
            self._maybe_emit(self.root)
        self._launch(ready)
        self._finish_if_idle()

    # -- scheduling (under the lock) ------------------------------------------------------------

    def _ready(self, scope: _Scope) -> list[tuple[Step, _Scope]]:
        """Steps that can start now in `scope` and the branches below it, marked as started."""
        ready = []
        for branch in scope.descendants():
            for step in self.steps:
                if branch.started_above(step.index):
                    continue
                if all(tensor in self.absent or branch.find(tensor) is not None for _, tensor in step.inputs):
                    branch.started.add(step.index)
                    ready.append((step, branch))
        limit = self.plan.max_inflight
        if limit:
            self._waiting.extend(ready)
            ready = []
            while self._waiting and self._inflight < limit:
                ready.append(self._waiting.popleft())
                self._inflight += 1
        else:
            self._inflight += len(ready)
        return ready

    def _maybe_emit(self, scope: _Scope) -> None:
        """Branches that now have every wanted output become answers; each is held until the
        next one (or the end) shows whether it is the final one. Answers go out under the lock,
        so they reach the client in order and none after the final one."""
        for branch in scope.descendants():
            if branch.emitted_above():
                continue
            found = {name: branch.find(name) for name in self.wanted}
            if all(tensor is not None for tensor in found.values()):
                branch.emitted = True
                outputs = {name: tensor.data for name, tensor in found.items()}  # type: ignore[union-attr]
                previous, self._held = self._held, outputs
                if previous is not None:
                    self.emit(previous, False)

    # -- steps ----------------------------------------------------------------------------------

    def _launch(self, ready: list[tuple[Step, _Scope]]) -> None:
        for step, scope in ready:
            if self._done:
                return  # failed meanwhile: nothing more starts
            if self.is_cancelled():
                self._fail(Cancelled(f"in ensemble '{self.plan.name}', the request was cancelled"))
                return
            request = self._step_request(step, scope)
            answered: list[bool | None] = [False]  # whether this step request answered yet; its key in _cancellers
            try:
                cancel = self.submit(request, lambda response, s=step, sc=scope, a=answered:
                                     self._on_response(s, sc, a, response))
            except NaiadError as error:
                self._fail(self._step_error(step, error))
                return
            with self._lock:
                if answered[0] is not None:  # not finished already (an answer can come at once)
                    self._cancellers[id(answered)] = cancel

    def _step_request(self, step: Step, scope: _Scope) -> InferRequest:
        inputs = []
        for name, tensor_name in step.inputs:
            tensor = scope.find(tensor_name)
            if tensor is not None:  # None: an optional ensemble input the client did not send
                inputs.append(Tensor(name, tensor.datatype, tensor.shape, tensor.data, tensor.parameters))
        wanted = [RequestedOutput(name) for name, _ in step.outputs]
        request = InferRequest(step.model_name, step.model_version, inputs, wanted, self.request.id,
                               self.request.parameters)
        if self.on_child is not None:
            self.on_child(request)
        return request

    def _on_response(self, step: Step, scope: _Scope, answered: list[bool | None], response: InferResponse) -> None:
        if self._done:
            return  # the run failed: late answers of other steps are dropped
        if response.error is not None:
            with self._lock:
                self._cancellers.pop(id(answered), None)  # this one is over; cancel the others
            self._fail(self._step_error(step, response.error))
            return
        first_and_final = response.final and answered[0] is False
        answered[0] = True
        ready: list[tuple[Step, _Scope]] = []
        with self._lock:
            if response.outputs:
                by_name = {t.name: t for t in response.outputs}
                target = scope if first_and_final else _Scope(scope)
                if target is not scope:
                    scope.children.append(target)
                for name, tensor_name in step.outputs:
                    tensor = by_name.get(name)
                    if tensor is not None:
                        target.tensors[tensor_name] = tensor
                ready = self._ready(target)
                self._maybe_emit(target)
            if response.final:
                self._inflight -= 1
                self._cancellers.pop(id(answered), None)
                answered[0] = None  # finished: nothing to cancel
                ready += self._unblocked()
        self._launch(ready)
        if response.final:
            self._finish_if_idle()

    def _unblocked(self) -> list[tuple[Step, _Scope]]:
        """Waiting steps that fit under max_inflight_requests now (under the lock)."""
        ready = []
        limit = self.plan.max_inflight
        while self._waiting and (not limit or self._inflight < limit):
            ready.append(self._waiting.popleft())
            self._inflight += 1
        return ready

    def _step_error(self, step: Step, error: Exception) -> NaiadError:
        message = f"in ensemble '{self.plan.name}', {step.label()} failed: {error}"
        if isinstance(error, NaiadError):
            return type(error)(message, error.status)
        return InternalError(message)

    def _fail(self, error: NaiadError) -> None:
        """Answer with `error` at once and stop: steps in flight are cancelled, their answers dropped."""
        with self._lock:
            if self._done:
                return
            self._done = True
            self._held = None
            cancellers = list(self._cancellers.values())
            self.emit(error, True)
        for cancel in cancellers:
            cancel()

    # -- the end ---------------------------------------------------------------------------------

    def _finish_if_idle(self) -> None:
        with self._lock:
            if self._done or self._inflight or self._waiting:
                return
            self._done = True
            held, self._held = self._held, None
            if held is not None:
                self.emit(held, True)
            elif any(scope.emitted for scope in self.root.descendants()):
                self.emit(None, True)  # the answers went out already (decoupled steps): flags only
            else:
                missing = [name for name in self.wanted if self.root.find(name) is None]
                self.emit(InternalError(f"in ensemble '{self.plan.name}', no step produced output(s) "
                                        f"{', '.join(missing)}"), True)
