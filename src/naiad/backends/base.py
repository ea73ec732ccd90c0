"""The backend contract: backend → model → instance, as in Triton.

A `Model` holds what its instances share (the loaded file, the completed config); the core asks
it for one `ModelInstance` per instance-group slot. Every instance runs batches through ONE
non-blocking contract, `submit(batch, sender) -> bool`, and answers through the `BatchSender`
it is given:

* `submit` returns at once. True: the instance took the batch. False: it cannot start it now
  (a model process restarting, an engine that is full) and took nothing; it then calls the
  room callback (`set_on_room`) once it can. It never raises for a request's own problem: that
  request is answered with its error. The scheduler decides when to submit (a request is
  queued, under the model's queue policy, until its batch is submitted); instances that can
  hold several batches at once (a model process's pipe) say how many with `depth`.
* For each batch it took, the instance calls `sender.executed(times)` exactly once, when the
  model is done executing it (before it sends the responses `execute` returned, so statistics
  are in place when a client sees its answer), and `sender.send(index, result, final)` for each
  request: any number of responses for decoupled models, exactly one otherwise, the last with
  `final=True`. Sends may come from any thread; `executed` may come before `submit` returns.
* An instance that dies answers every open request with an error (`sender.close_open`) and
  still calls `executed` for each batch it held.

Framework backends whose `execute(batch)` blocks get the contract from `ThreadedInstance`
(backends/threaded.py): one thread per instance runs their `execute` (or `execute_decoupled`).
Such an instance `pulls`: under the default scheduler and the dynamic batcher it is not handed
batches but `serve`s, taking its next batch itself when its thread is idle (the same sender rules
apply); the sequence batcher and rate-limited instances still `submit`. A threaded instance
that allows it also runs a short batch on the submitting thread when it is idle (`execute_here`).
The Python backend (model processes), the LLM engine and ensembles implement `submit` directly.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.observability.custom_metrics import CustomMetrics
from naiad.observability.metrics import MetricRow
from naiad.types import InferRequest, InferResponse

Outputs = dict[str, np.ndarray]
RequestResult = Outputs | Exception


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

    def custom_metrics(self) -> CustomMetrics:
        """The server-wide registry of the metric families models create, printed on /metrics
        as the models declared them (Triton's TRITONSERVER_Metric* API)."""
        ...

    def call_soon(self, callback: Callable[[], None]) -> bool:
        """When called on the server's event loop: run `callback` once the loop has handled what
        is ready now (so work can be gathered first) and return True; elsewhere return False."""
        ...

    def watch(self, fd: int, on_readable: Callable[[], None]) -> Callable[[], None] | None:
        """Call `on_readable` from the server's event loop whenever `fd` is readable; returns the
        function that stops it, or None when the server runs no event loop. The stop function
        may be called any number of times from any thread, the loop's included; each call returns
        only once the loop no longer watches `fd`, so the caller may close it next. The loop
        (uvloop's libuv) makes `fd` non-blocking: whoever else writes to it must take partial
        writes and wait for room itself, as `naiad.channel.Channel` does (a plain
        `Connection.send_bytes` sends part of a message and fails)."""
        ...

    def watch_writable(self, fd: int, on_writable: Callable[[], None]) -> Callable[[], None] | None:
        """`watch` for room to write: `on_writable` is called from the event loop while `fd` can
        take more bytes, until the returned function stops it."""
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

    __slots__ = ("_inputs", "batched", "is_cancelled", "layout", "requests", "sizes", "split_ns")

    def __init__(self, requests: list[InferRequest], batched: bool, layout: RaggedLayout | None = None,
                 is_cancelled: Callable[[int], bool] = never_cancelled) -> None:
        self.requests = requests
        self.batched = batched
        self.layout = layout
        self.is_cancelled = is_cancelled  # whether the client of request i went away
        self.sizes = [_batch_size(r) for r in requests] if batched else [1] * len(requests)
        self._inputs: dict[str, np.ndarray] | None = None
        self.split_ns = 0  # time spent splitting outputs per request: the backend's compute_output

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
        """Slice each output back per request along dim 0 (views, no copies); its time is the
        batch's compute_output."""
        began = time.monotonic_ns()
        if len(self.requests) == 1:
            results = [dict(outputs)]
        else:
            results = [{} for _ in self.requests]
            for name, array in outputs.items():
                start = 0
                for i, size in enumerate(self.sizes):
                    results[i][name] = array[start : start + size]
                    start += size
        self.split_ns += time.monotonic_ns() - began
        return results


def _describe(spec: BatchInput, parts: list[np.ndarray]) -> np.ndarray:
    """The batch-input tensor of `spec.kind` for the source input's per-request arrays."""
    counts = np.array([p.size for p in parts], dtype=np.int64)
    values: np.ndarray
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


class ExecutionTimes(NamedTuple):
    """When one batch's execution started and passed each phase (time.monotonic_ns(), the
    same clock in every process): compute_input ends at `input_end_ns` (inputs gathered),
    compute_infer at `infer_end_ns` (the model's execute returned), compute_output at `end_ns`
    (outputs ready for the responses)."""

    start_ns: int
    input_end_ns: int
    infer_end_ns: int
    end_ns: int

    @classmethod
    def instant(cls, at_ns: int) -> ExecutionTimes:
        """An execution with no time of its own (an ensemble's, an engine that only queued it)."""
        return cls(at_ns, at_ns, at_ns, at_ns)


class BatchSender(ABC):
    """Where an instance answers the requests of one batch it took (implemented by the core)."""

    @abstractmethod
    def send(self, index: int, result: Outputs | Exception | None, final: bool) -> None:
        """Answer request `index` of the batch: outputs, an error for that request alone, or
        None for a flags-only response (decoupled models)."""

    @abstractmethod
    def executed(self, times: ExecutionTimes) -> None:
        """The model is done executing the batch (exactly once per batch)."""

    @abstractmethod
    def close_open(self, error: Exception | None) -> None:
        """Answer every request still open: with `error`, or an empty final response."""


#: what `ModelInstance.serve` calls for its next batch (None: stop serving)
Take = Callable[[], "tuple[Batch, BatchSender] | None"]
#: what `ModelInstance.execute_here` calls for the batch it runs
TakeOne = Callable[[], "tuple[Batch, BatchSender]"]


class ModelInstance(ABC):
    """One execution context of a model: see the module docstring for the contract."""

    #: batches the instance may hold at once (the default scheduler keeps up to this many on it;
    #: batching schedulers give it one at a time)
    depth: int = 1
    #: the `reason` label of nv_inference_request_failure for a request that ran and failed
    failure_reason: str = "BACKEND"

    #: whether `serve` works: the instance runs batches on a thread of its own, which can take
    #: them from a queue it shares with the model's other instances
    pulls: bool = False

    @abstractmethod
    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        """Start executing `batch` without blocking; False (taking nothing) when it cannot now."""

    def serve(self, take: Take) -> None:
        """For instances that `pulls`: from now on, whenever idle, run the batch `take()` returns
        (it blocks until there is one) until it returns None. Every other rule of `submit` holds
        for those batches. This is how the default scheduler (one shared queue: a request costs
        its submitter one put) and the dynamic batcher (a batch forms when a thread is ready to
        run it) feed instances that run on threads of their own."""
        raise NotImplementedError(f"{type(self).__name__} runs no thread of its own to serve from")

    def execute_here(self, take: TakeOne) -> bool:
        """For instances that `pulls`: when the instance is idle and allows it, run the batch
        `take()` returns on the calling thread, now, and return True once it is executed and
        answered; otherwise return False at once without calling `take`. Every other rule of
        `submit` holds. The default scheduler uses it to spare a short execution the two thread
        hand-offs (to the instance's thread and back), which cost as much as the execution."""
        return False

    def set_on_room(self, callback: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """`callback` (from any thread, holding no lock) once the instance can take batches again
        after `submit` returned False. Instances that never refuse need not keep it."""

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

    def host_bytes_reserved(self) -> int:
        """Host memory the instance holds whether or not its pages were touched yet (an LLM's
        KV cache on the CPU): a memory budget counts at least this much for it."""
        return 0

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
