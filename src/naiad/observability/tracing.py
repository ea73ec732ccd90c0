"""Triton-mode request tracing: the trace settings (global and per model) and the JSON trace files.

A sampled request carries a `Trace` that the core stamps as it goes (REQUEST_START,
QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END,
INFER_RESPONSE_COMPLETE, with monotonic ns). Finished traces are written in Triton's format, a
JSON array where each trace is an object with its id, model, version, request id and parent id,
followed by an object with its timestamps: to `trace_file` at shutdown when `log_frequency` is 0,
else to `trace_file.<n>` every `log_frequency` traces. A request is sampled one in `trace_rate`
(per model) while `trace_count` (-1: no limit) lasts, and only when `trace_level` is not OFF.

Not yet (issue 7 goes on): the frontends' HTTP_RECV / HTTP_SEND / GRPC_* stamps, the TENSORS
level's tensor dumps, OpenTelemetry mode, and BLS / ensemble children joined to their parent.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.errors import InvalidArgument

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
#: the settings a client may change, with how their values read
_KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass(slots=True)
class Trace:
    """One sampled request's trace."""

    id: int
    model_name: str
    model_version: int
    request_id: str
    parent_id: int = 0
    timestamps: list[tuple[str, int]] = field(default_factory=list)

    def stamp(self, name: str) -> None:
        self.timestamps.append((name, time.monotonic_ns()))

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {"id": self.id, "model_name": self.model_name, "model_version": self.model_version,
             "request_id": self.request_id, "parent_id": self.parent_id},
            {"id": self.id, "timestamps": [{"name": name, "ns": ns} for name, ns in sorted(self.timestamps,
                                                                                      key=lambda item: item[1])]},
        ]


@dataclass(slots=True)
class _Sampler:
    """One model's (or the global) sampling state under its effective settings."""

    seen: int = 0
    remaining: int = -1  # traces left to take; -1 = no limit


class Tracer:
    """The trace settings API's store and the traces' sampler and writer (thread-safe)."""

    def __init__(self, settings: dict[str, str | list[str]] | None = None) -> None:
        self._global: dict[str, str | list[str]] = {
            "trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": "triton",
        }
        self._models: dict[str, dict[str, str | list[str]]] = {}
        self._samplers: dict[str, _Sampler] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._buffer: list[Trace] = []
        self._files_written = 0
        if settings:
            self.update(None, dict(settings))

    # -- the settings API ---------------------------------------------------------------------

    def get(self, model: str | None) -> dict[str, str | list[str]]:
        with self._lock:
            return dict(self._effective(model))

    def update(self, model: str | None, changes: dict[str, Any]) -> dict[str, str | list[str]]:
        """Apply `changes` (Triton's JSON: strings, trace_level a list; a model's `null` falls back
        to the global value) and return the settings now in force."""
        checked = {key: _check(key, value, model is not None) for key, value in changes.items()}
        with self._lock:
            target = self._global if model is None else self._models.setdefault(model, {})
            for key, value in checked.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
            if "trace_count" in checked or "trace_rate" in checked or "trace_level" in checked:
                self._samplers.clear()  # counting starts over under the new settings
            return dict(self._effective(model))

    def _effective(self, model: str | None) -> dict[str, str | list[str]]:
        settings = dict(self._global)
        if model is not None:
            settings.update(self._models.get(model, {}))
        return settings

    # -- sampling and writing -----------------------------------------------------------------

    def start(self, model: str, version: int, request_id: str) -> Trace | None:
        """A trace for this request when it is sampled, else None (the common, cheap case)."""
        with self._lock:
            settings = self._effective(model)
            if settings["trace_level"] == ["OFF"]:
                return None
            sampler = self._samplers.get(model)
            if sampler is None:
                sampler = self._samplers[model] = _Sampler(remaining=int(str(settings["trace_count"])))
            sampler.seen += 1
            if sampler.remaining == 0 or (sampler.seen - 1) % int(str(settings["trace_rate"])) != 0:
                return None
            if sampler.remaining > 0:
                sampler.remaining -= 1
            return Trace(next(self._ids), model, version, request_id)

    def finish(self, trace: Trace) -> None:
        with self._lock:
            self._buffer.append(trace)
            frequency = int(str(self._effective(trace.model_name)["log_frequency"]))
            if frequency > 0 and len(self._buffer) >= frequency:
                self._write(self._global_file(), indexed=True)

    def flush(self) -> None:
        """Write what is buffered (at shutdown)."""
        with self._lock:
            if self._buffer:
                self._write(self._global_file(), indexed=int(str(self._global["log_frequency"])) > 0)

    def _global_file(self) -> str:
        return str(self._global["trace_file"])

    def _write(self, path: str, indexed: bool) -> None:
        traces, self._buffer = self._buffer, []
        if not path:
            return  # no trace_file: traces are dropped, as Triton does
        target = Path(f"{path}.{self._files_written}" if indexed else path)
        self._files_written += 1
        target.write_text(json.dumps([item for trace in traces for item in trace.as_json()]))


def _check(key: str, value: Any, for_model: bool) -> str | list[str] | None:
    if key == "trace_mode":
        raise InvalidArgument("trace_mode cannot be changed at runtime")
    if key not in _KEYS:
        raise InvalidArgument(f"unknown trace setting '{key}'")
    if value is None:
        if not for_model:
            raise InvalidArgument(f"trace setting '{key}' cannot be cleared globally")
        return None
    if key == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or not all(isinstance(level, str) and level in LEVELS for level in levels):
            raise InvalidArgument(f"trace_level must be a list of {', '.join(LEVELS)}, got {value!r}")
        return [str(level) for level in levels]
    if not isinstance(value, str):
        raise InvalidArgument(f"trace setting '{key}' must be a string, got {value!r}")
    if key in ("trace_rate", "trace_count", "log_frequency"):
        try:
            number = int(value)
        except ValueError:
            raise InvalidArgument(f"trace setting '{key}' must be an integer, got {value!r}") from None
        lowest = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}[key]
        if number < lowest:
            raise InvalidArgument(f"trace setting '{key}' must be at least {lowest}, got {value!r}")
    return value


def settings_from_flags(trace_config: list[str], file: str | None = None, levels: list[str] | None = None,
                        rate: str | None = None, count: str | None = None,
                        log_frequency: str | None = None) -> dict[str, str | list[str]]:
    """Trace settings from `--trace-config [mode,]key=value` items and the deprecated
    --trace-file / --trace-level / --trace-rate / --trace-count / --trace-log-frequency flags.
    Raises ValueError for what naiad does not support (OpenTelemetry mode, for now)."""
    settings: dict[str, str | list[str]] = {}
    names = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "file": "trace_file",
             "log-frequency": "log_frequency", "log_frequency": "log_frequency"}
    for item in trace_config:
        mode, _, setting = item.rpartition(",")
        key, _, value = setting.partition("=")
        if mode not in ("", "triton"):
            raise ValueError(f"--trace-config mode '{mode}' is not supported yet (only triton)")
        if key == "mode":
            if value != "triton":
                raise ValueError(f"--trace-config mode={value} is not supported yet (only triton)")
            continue
        if key not in names:
            raise ValueError(f"unknown --trace-config setting '{key}'")
        settings[names[key]] = [value] if key == "level" else value
    for name, value in (("trace_file", file), ("trace_rate", rate), ("trace_count", count),
                        ("log_frequency", log_frequency)):
        if value is not None:
            settings[name] = value
    if levels:
        settings["trace_level"] = levels
    return settings
