"""A fake pb_utils runtime for the pb_utils tests: records what pb_utils hands the model process."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from naiad.backends.python import pb_utils


class FakeRuntime:
    """Records what pb_utils hands the model process; answers from canned values."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, pb_utils.InferenceResponse | None, int]] = []
        self.logs: list[tuple[int, str, str, int]] = []
        self.execs: list[tuple[pb_utils.InferenceRequest, bool]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.cancelled: set[object] = set()
        self.fail_with: Exception | None = None
        self.ready = True

    def send(self, handle: object, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append((handle, response, flags))

    def is_cancelled(self, handle: object) -> bool:
        return handle in self.cancelled

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        self.execs.append((request, decoupled))
        response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.0], np.float32))])
        if decoupled:
            return iter([response, pb_utils.InferenceResponse()])
        return response

    async def async_exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        await asyncio.sleep(0)
        return self.exec(request, decoupled)

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        self.logs.append((level, message, filename, line))

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("load", model_name, config, files))

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("unload", model_name, unload_dependents))

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(("ready", model_name, model_version))
        return self.ready


class MetricRuntime(FakeRuntime):
    """Also the custom-metric hooks: counts the "changes are waiting" calls; `value` answers
    metric_value (None: pb_utils answers with the process's own copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0
        self.values_asked: list[int] = []
        self.value: float | None = None

    def metrics_changed(self) -> None:
        self.wakes += 1

    def metric_value(self, series: int) -> float | None:
        self.values_asked.append(series)
        return self.value
