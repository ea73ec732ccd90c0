"""The backend contract: backend → model → instance, as in Triton.

A `Model` holds what its instances share (the loaded file, the completed config); the core
asks it for one `ModelInstance` per instance-group slot and runs each instance on its own
thread. `ModelInstance.execute` receives a `Batch` and returns one result per request: a dict
of output arrays, or an exception for that request alone. Raising from `execute` means the
instance itself is broken: every request in the batch fails.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.observability.metrics import MetricRow
from naiad.types import InferRequest, InferResponse

Outputs = dict[str, np.ndarray]
RequestResult = Outputs | Exception
#: send(request index in the batch, outputs / error / None for a flags-only response, final)
ResponseSender = Callable[[int, Outputs | Exception | None, bool], None]


class ParameterizedOutputs(dict[str, np.ndarray]):
    """Outputs that also carry response parameters (Python models can set them)."""

    __slots__ = ("parameters",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.parameters: dict[str, Any] = {}


class Host(Protocol):
    """What the server offers backends whose models call back into it (the Python backend's
    BLS and model control), without the backend importing the core."""

    def submit(self, request: InferRequest, sink: Callable[[InferResponse], None],
               decoupled: bool) -> Callable[[], None]:
        """Queue `request` for any model; responses reach `sink` from other threads. Returns a
        function that cancels it. Raises NaiadError when it cannot be queued."""
        ...

    def control(self, op: str, args: list[Any]) -> Any:
        """load_model / unload_model / is_model_ready with pb_utils' arguments."""
        ...

    def backend_config(self, backend: str) -> Mapping[str, str]:
        """--backend-config settings for `backend`."""
        ...

    def call_soon(self, callback: Callable[[], None]) -> bool:
        """When called on the server's event loop: run `callback` once the loop has handled what
        is ready now (so work can be gathered first) and return True; elsewhere return False."""
        ...

    def watch(self, fd: int, on_readable: Callable[[], None]) -> Callable[[], None] | None:
        """Call `on_readable` from the server's event loop whenever `fd` is readable; returns the
        function that stops it, or None when the server runs no event loop."""
        ...


def never_cancelled(index: int) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class BatchInput:
    """A config `batch_input`: a tensor the server makes to describe the batch it formed."""

    kind: str  # BATCH_ELEMENT_COUNT, BATCH_ACCUMULATED_ELEMENT_COUNT[_WITH_ZERO], ...
    target: str
    dtype: np.dtype[Any]
    source: str


@dataclass(frozen=True, slots=True)
class RaggedLayout:
    """Inputs with allow_ragged_batch (concatenated flat) and the batch inputs to add."""

    ragged: frozenset[str] = frozenset()
    batch_inputs: tuple[BatchInput, ...] = ()


class Batch:
    """Requests that execute together.

    It owns concatenation along the batch dimension (for models with max_batch_size > 0), the
    flat concatenation of ragged inputs with their batch-input descriptors, and the split of
    outputs back into per-request slices.
    """

    __slots__ = ("_inputs", "batched", "is_cancelled", "layout", "requests", "sizes")

    def __init__(self, requests: list[InferRequest], batched: bool, layout: RaggedLayout | None = None,
                 is_cancelled: Callable[[int], bool] = never_cancelled) -> None:
        self.requests = requests
        self.batched = batched
        self.layout = layout
        self.is_cancelled = is_cancelled  # whether the client of request i went away
        self.sizes = [_batch_size(r) for r in requests] if batched else [1] * len(requests)
        self._inputs: dict[str, np.ndarray] | None = None

    @property
    def size(self) -> int:
        """Total batch size: the sum of the requests' batch dimensions (1 each when not batching)."""
        return sum(self.sizes)

    def inputs(self) -> dict[str, np.ndarray]:
        """Input arrays by name, concatenated along dim 0 when several requests batch together
        (computed once: the core times it as compute_input before the backend runs)."""
        if self._inputs is None:
            self._inputs = self._gather()
        return self._inputs

    def _gather(self) -> dict[str, np.ndarray]:
        first = self.requests[0]
        if len(self.requests) == 1 and self.layout is None:
            return {t.name: t.data for t in first.inputs}
        by_name: dict[str, list[np.ndarray]] = {}
        for request in self.requests:
            for tensor in request.inputs:
                by_name.setdefault(tensor.name, []).append(tensor.data)
        if self.layout is None:
            return {name: np.concatenate(parts) for name, parts in by_name.items()}
        ragged = self.layout.ragged
        arrays = {
            name: np.concatenate([p.reshape(-1) for p in parts]) if name in ragged else np.concatenate(parts)
            for name, parts in by_name.items()
        }
        for spec in self.layout.batch_inputs:
            arrays[spec.target] = _describe(spec, by_name.get(spec.source, []))
        return arrays

    def split(self, outputs: Mapping[str, np.ndarray]) -> list[Outputs]:
        """Slice each output back per request along dim 0 (views, no copies)."""
        if len(self.requests) == 1:
            return [dict(outputs)]
        results: list[Outputs] = [{} for _ in self.requests]
        for name, array in outputs.items():
            start = 0
            for i, size in enumerate(self.sizes):
                results[i][name] = array[start : start + size]
                start += size
        return results


def _describe(spec: BatchInput, parts: list[np.ndarray]) -> np.ndarray:
    """The batch-input tensor of `spec.kind` for the source input's per-request arrays."""
    counts = np.array([p.size for p in parts], dtype=np.int64)
    if spec.kind == "BATCH_ELEMENT_COUNT":
        values = counts
    elif spec.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        values = np.cumsum(counts)
    elif spec.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        values = np.concatenate([[0], np.cumsum(counts)])
    elif spec.kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        values = np.zeros(int(counts.max(initial=0)))  # only its shape carries the information
    elif spec.kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        values = np.array([p.shape[1:] for p in parts], dtype=np.int64)
        if spec.kind == "BATCH_ITEM_SHAPE_FLATTEN":
            values = values.reshape(-1)
    else:
        raise ValueError(f"unknown batch input kind {spec.kind}")
    return values.astype(spec.dtype)


def _batch_size(request: InferRequest) -> int:
    return request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 1


class ModelInstance(ABC):
    """One execution context of a model; `execute` is only ever called from one thread at a time."""

    #: whether the core concatenates a batch's inputs before `execute` (off for backends that
    #: hand each request to the model separately, like Python models)
    gathers_inputs: bool = True
    #: instances that run batches elsewhere (a model process) and answer from their own thread:
    #: the core calls `start` instead of `execute` / `execute_decoupled`
    answers_later: bool = False
    #: the `reason` label of nv_inference_request_failure for a request that ran and failed
    failure_reason: str = "BACKEND"

    @abstractmethod
    def execute(self, batch: Batch) -> list[RequestResult]:
        """Run the batch; return one result per request, in order."""

    def execute_decoupled(self, batch: Batch, send: ResponseSender) -> None:
        """Decoupled models (model_transaction_policy.decoupled) answer through `send`: any number
        of responses per request, the last one with final=True. A request left without its final
        response when this returns is closed with an empty final response."""
        raise NotImplementedError(f"{type(self).__name__} does not support decoupled models")

    def start(self, batch: Batch, send: ResponseSender, executed: Callable[[], None], blocking: bool = True) -> bool:
        """Instances that answer later: hand the batch over and return. When the instance has no
        room, wait for it (`blocking`) or return False at once, taking nothing. Answer each
        request through `send`, from any thread (other models: exactly one final response each),
        and call `executed` once the model's execute returned (the instance's time for the batch)."""
        raise NotImplementedError(f"{type(self).__name__} does not answer later")

    def set_on_room(self, callback: Callable[[], None]) -> None:
        """Instances that answer later: call `callback` (from any thread, holding no lock)
        whenever room frees up after `start(..., blocking=False)` returned False."""
        raise NotImplementedError(f"{type(self).__name__} does not answer later")

    def is_ready(self) -> bool:
        """Whether the instance can serve (model-ready endpoints ask; must not block)."""
        return True

    def not_ready_reason(self) -> str:
        """Why the instance does not serve now ("" when it does): the repository index shows it."""
        return ""

    def metrics(self) -> list[MetricRow]:
        """Backend-specific metric samples for /metrics (the core adds the model and version
        labels); read at scrape time, from another thread, so must not block."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds."""


class Model(ABC):
    """A loaded model version; creates its instances."""

    #: the backend name as it appears in config `backend`
    backend_name: str = ""
    #: set by the core before instances are created
    host: Host | None = None

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        self.config = config
        self.version_dir = version_dir
        self.version = version

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        """Fill what the config leaves out from the model file (inputs, outputs, max_batch_size).

        Returns True when auto-complete made the model batch (Triton then adds dynamic batching).
        """
        return False

    @classmethod
    def default_instance_count(cls) -> int:
        """Instances per group when the config gives no count."""
        return 1

    @abstractmethod
    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        """Create the `index`-th instance of `group`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the model holds after all its instances are closed."""
