"""The hook through which pb_utils reaches the server: the model process installs its runtime here
(`pb_utils._set_runtime`); without one, the parts that need the server refuse (see pb_utils)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from naiad.backends.python.pb_utils import InferenceRequest, InferenceResponse

# -- the runtime hook ------------------------------------------------------------------------


class Runtime(Protocol):
    """What the model process provides to this module through `_set_runtime()`.

    `handle` is the opaque object the stub gave `InferenceRequest._received()`. Errors the runtime
    raises from `load_model` / `unload_model` / `is_model_ready` should carry the server's message
    alone: pb_utils adds upstream's "Failed to load model: " style prefix. `exec` should raise
    `TritonModelException("BLS is only supported during the 'execute' function.")` outside
    `execute`, as upstream does.

    Custom metrics (see pb_metrics): the runtime collects changes with `pb_metrics.take_changes()`
    and sends them to the server. It may define `metrics_changed() -> None`, called when changes
    start waiting (send them soon), and `metric_value(series: int) -> float | None`, the server's
    value of a series after the waiting changes reached it (None when it cannot ask now).
    """

    def send(self, handle: object, response: InferenceResponse | None, flags: int) -> None:
        """Deliver one response (None: flags only) for the received request `handle`."""

    def is_cancelled(self, handle: object) -> bool:
        """Whether the client cancelled the received request `handle`."""

    def exec(self, request: InferenceRequest, decoupled: bool) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run a BLS request; for decoupled=True an iterator of responses with a `cancel()` method."""

    async def async_exec(
        self, request: InferenceRequest, decoupled: bool
    ) -> InferenceResponse | Iterator[InferenceResponse]:
        """`exec` for `async def execute` models."""

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        """Write a model log line to the server log; `level` is a `Logger.LogLevel` value."""

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        """Load (or reload) a model; explicit model-control mode only."""

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        """Unload a model."""

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        """Readiness of a model version ("" for the server's choice of version)."""


_runtime: Runtime | None = None

NO_RUNTIME = "no naiad runtime is attached to this process"


def install(runtime: Runtime | None) -> None:
    """Attach (or, with None, detach) the model process's runtime."""
    global _runtime
    _runtime = runtime


def get() -> Runtime | None:
    return _runtime
