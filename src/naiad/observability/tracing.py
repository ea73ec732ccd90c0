"""Triton-mode request tracing: the trace settings (global and per model) and the JSON trace files.

A sampled request carries a `Trace` that the core stamps as it goes (REQUEST_START,
QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END,
INFER_RESPONSE_COMPLETE, with monotonic ns); HTTP /infer adds HTTP_RECV_START/END before and
HTTP_SEND_START/END after, ending the trace itself once its reply is written. Finished traces
are written in Triton's format, a JSON array where each trace is an object with its id, model,
version, request id and parent id, followed by an object with its timestamps: to `trace_file`
at shutdown when `log_frequency` is 0, else to `trace_file.<n>` every `log_frequency` traces.
A request is sampled one in `trace_rate` (per model) while `trace_count` (-1: no limit) lasts,
and only when `trace_level` is not OFF.

In OpenTelemetry mode (`--trace-config mode=opentelemetry`) a finished trace becomes spans
exported over OTLP/HTTP by the OpenTelemetry SDK's batch processor (its OTEL_* settings apply):
an "InferRequest" span from REQUEST_START to REQUEST_END with "queue" and "compute" children,
under the client's span when the request carried a W3C `traceparent` (such requests are always
traced; `rate=0` traces only them). Settings cannot change at runtime in that mode, as in Triton.

At the TENSORS level a trace also lists the request's inputs as queued (TENSOR_QUEUE_INPUT)
and its outputs as returned (TENSOR_BACKEND_OUTPUT). The children of a traced request (ensemble
steps) are traced too, with its id as their parent_id (in OpenTelemetry mode, as child spans).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.errors import InvalidArgument

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
#: the settings a client may change, with how their values read
_KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass(slots=True, weakref_slot=True)  # the Python backend finds a BLS call's parent weakly
class Trace:
    """One sampled request's trace."""

    id: int
    model_name: str
    model_version: int
    request_id: str
    parent_id: int = 0
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    context: dict[str, str] | None = None  # the client's W3C trace context, if any
    span: Any = None  # OpenTelemetry mode: the request's span, open from start to finish
    #: TENSORS level: (activity, tensor) for the inputs as queued and the outputs as returned;
    #: None at the TIMESTAMPS level
    tensors: list[tuple[str, Any]] | None = None

    def stamp(self, name: str) -> None:
        self.timestamps.append((name, time.monotonic_ns()))

    def record(self, activity: str, tensors: list[Any]) -> None:
        """Keep `tensors` (naiad.types.Tensor: name, datatype, shape, data) for the TENSORS level."""
        if self.tensors is not None:
            self.tensors.extend((activity, tensor) for tensor in tensors)

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {"id": self.id, "model_name": self.model_name, "model_version": self.model_version,
             "request_id": self.request_id, "parent_id": self.parent_id},
            {"id": self.id, "timestamps": [{"name": name, "ns": ns} for name, ns in sorted(self.timestamps,
                                                                                      key=lambda item: item[1])]},
            *({"id": self.id, "activity": activity, "tensor": _tensor_json(tensor)}
              for activity, tensor in self.tensors or ()),
        ]


def _tensor_json(tensor: Any) -> dict[str, str]:
    """A tensor as Triton's TENSORS trace writes it: values, comma-separated, and its shape."""
    values = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in tensor.data.flat)
    datatype = getattr(tensor.datatype, "value", tensor.datatype)
    return {"name": tensor.name, "data": ",".join(values), "shape": ",".join(str(d) for d in tensor.shape),
            "dtype": str(datatype)}


@dataclass(slots=True)
class _Sampler:
    """One model's (or the global) sampling state under its effective settings."""

    seen: int = 0
    remaining: int = -1  # traces left to take; -1 = no limit


class Tracer:
    """The trace settings API's store and the traces' sampler and writer (thread-safe)."""

    def __init__(self, settings: dict[str, str | list[str]] | None = None,
                 opentelemetry: dict[str, str] | None = None) -> None:
        self.mode = "opentelemetry" if opentelemetry is not None else "triton"
        self._global: dict[str, str | list[str]] = {
            "trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": self.mode,
        }
        self._exporter = OtlpExporter(opentelemetry) if opentelemetry is not None else None
        self._all_off = True  # no level but OFF anywhere: `start` returns at once, without the lock
        self._models: dict[str, dict[str, str | list[str]]] = {}
        self._samplers: dict[str, _Sampler] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._buffer: list[Trace] = []
        self._files_written = 0
        if settings:
            self._apply(None, dict(settings))

    # -- the settings API ---------------------------------------------------------------------

    def get(self, model: str | None) -> dict[str, str | list[str]]:
        with self._lock:
            return dict(self._effective(model))

    def update(self, model: str | None, changes: dict[str, Any]) -> dict[str, str | list[str]]:
        """Apply `changes` (Triton's JSON: strings, trace_level a list; a model's `null` falls back
        to the global value) and return the settings now in force."""
        if self.mode == "opentelemetry":
            raise InvalidArgument("trace settings cannot be updated in opentelemetry mode")
        return self._apply(model, changes)

    def _apply(self, model: str | None, changes: dict[str, Any]) -> dict[str, str | list[str]]:
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
            levels = [self._global["trace_level"], *(m["trace_level"] for m in self._models.values()
                                                      if "trace_level" in m)]
            self._all_off = all(level == ["OFF"] for level in levels)
            return dict(self._effective(model))

    def _effective(self, model: str | None) -> dict[str, str | list[str]]:
        settings = dict(self._global)
        if model is not None:
            settings.update(self._models.get(model, {}))
        return settings

    # -- sampling and writing -----------------------------------------------------------------

    def start(self, model: str, version: int, request_id: str,
              context: dict[str, str] | None = None, parent: Trace | None = None) -> Trace | None:
        """A trace for this request when it is sampled, else None (the common, cheap case). The
        children of a traced request (ensemble steps, BLS calls: `parent`) are always traced,
        under their parent's id."""
        if parent is not None:
            return self._child(parent, model, version, request_id)
        if self._all_off:
            return None
        with self._lock:
            settings = self._effective(model)
            if settings["trace_level"] == ["OFF"]:
                return None
            propagated = self._exporter is not None and context is not None and "traceparent" in context
            if not propagated and not self._sampled(model, settings):
                return None
            trace = Trace(next(self._ids), model, version, request_id, context=context if propagated else None)
            if "TENSORS" in settings["trace_level"] and self._exporter is None:
                trace.tensors = []  # OpenTelemetry mode has no tensor activities, as in Triton
        if self._exporter is not None:
            self._exporter.begin(trace, None)
        return trace

    def _child(self, parent: Trace, model: str, version: int, request_id: str) -> Trace:
        with self._lock:
            trace = Trace(next(self._ids), model, version, request_id, parent_id=parent.id)
            if parent.tensors is not None:
                trace.tensors = []
        if self._exporter is not None:
            self._exporter.begin(trace, parent)
        return trace

    def _sampled(self, model: str, settings: dict[str, str | list[str]]) -> bool:
        sampler = self._samplers.get(model)
        if sampler is None:
            sampler = self._samplers[model] = _Sampler(remaining=int(str(settings["trace_count"])))
        sampler.seen += 1
        rate = int(str(settings["trace_rate"]))
        if sampler.remaining == 0 or rate == 0 or (sampler.seen - 1) % rate != 0:
            return False
        if sampler.remaining > 0:
            sampler.remaining -= 1
        return True

    def finish_sent(self, trace: Trace, protocol: str, sent: tuple[int, int]) -> None:
        """End a trace the frontend held: its reply went out between `sent` (monotonic ns)."""
        trace.timestamps += [(f"{protocol}_SEND_START", sent[0]), (f"{protocol}_SEND_END", sent[1])]
        self.finish(trace)

    @property
    def active(self) -> bool:
        """Whether any request may be traced (frontends skip their stamps otherwise)."""
        return not self._all_off

    def finish(self, trace: Trace) -> None:
        if self._exporter is not None:
            self._exporter.export(trace)
            return
        with self._lock:
            if not self._global_file():
                return  # nowhere to write it: dropped now rather than kept until shutdown
            self._buffer.append(trace)
            frequency = int(str(self._effective(trace.model_name)["log_frequency"]))
            if frequency > 0 and len(self._buffer) >= frequency:
                self._write(self._global_file(), indexed=True)

    def flush(self) -> None:
        """Write what is buffered (at shutdown); in OpenTelemetry mode, export what is queued."""
        if self._exporter is not None:
            self._exporter.shutdown()
            return
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
        # Whole or not at all: a tool reading trace files as they appear never sees half of one.
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(json.dumps([item for trace in traces for item in trace.as_json()]))
        os.replace(partial, target)


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
        lowest = {"trace_rate": 0, "trace_count": -1, "log_frequency": 0}[key]
        if number < lowest:
            raise InvalidArgument(f"trace setting '{key}' must be at least {lowest}, got {value!r}")
    return value


#: `--trace-config opentelemetry,<key>=<value>` keys
OTEL_KEYS = ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


def settings_from_flags(
    trace_config: list[str], file: str | None = None, levels: list[str] | None = None, rate: str | None = None,
    count: str | None = None, log_frequency: str | None = None,
) -> tuple[dict[str, str | list[str]], dict[str, str] | None]:
    """(trace settings, OpenTelemetry options or None for Triton mode) from `--trace-config
    [mode,]key=value` items and the deprecated --trace-file / --trace-level / --trace-rate /
    --trace-count / --trace-log-frequency flags. Raises ValueError for what is not understood."""
    settings: dict[str, str | list[str]] = {}
    otel: dict[str, str] = {}
    mode = "triton"
    names = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "file": "trace_file",
             "log-frequency": "log_frequency", "log_frequency": "log_frequency"}
    for item in trace_config:
        scope, _, setting = item.partition(",") if item.split("=", 1)[0].count(",") else ("", "", item)
        key, _, value = setting.partition("=")
        if scope == "opentelemetry":
            if key not in OTEL_KEYS:
                raise ValueError(f"unknown --trace-config opentelemetry setting '{key}'")
            otel[key] = value
            continue
        if scope not in ("", "triton"):
            raise ValueError(f"unknown --trace-config mode '{scope}' (triton or opentelemetry)")
        if key == "mode":
            if value not in ("triton", "opentelemetry"):
                raise ValueError(f"--trace-config mode={value}: the modes are triton and opentelemetry")
            mode = value
            continue
        if key not in names:
            raise ValueError(f"unknown --trace-config setting '{key}'")
        if key == "level":  # repeated, as Triton's levels are flags: TIMESTAMPS and TENSORS
            levels_so_far = settings.get("trace_level", [])
            settings["trace_level"] = [*levels_so_far, value] if value not in levels_so_far else levels_so_far
        else:
            settings[names[key]] = value
    for name, flag in (("trace_file", file), ("trace_rate", rate), ("trace_count", count),
                       ("log_frequency", log_frequency)):
        if flag is not None:
            settings[name] = flag
    if levels:
        settings["trace_level"] = levels
    return settings, (otel if mode == "opentelemetry" else None)


class OtlpExporter:
    """Finished traces as OpenTelemetry spans, batched and sent over OTLP/HTTP by the SDK."""

    def __init__(self, options: dict[str, str]) -> None:
        # Imported here: only this mode needs the SDK, and it takes a while to import.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.name": "triton"}
        if "resource" in options:
            key, _, value = options["resource"].partition("=")
            attributes[key] = value
        batch = {name: int(options[key]) for key, name in (
            ("bsp_max_queue_size", "max_queue_size"), ("bsp_schedule_delay", "schedule_delay_millis"),
            ("bsp_max_export_batch_size", "max_export_batch_size")) if key in options}
        exporter = OTLPSpanExporter(endpoint=options.get("url", "http://localhost:4318/v1/traces"))
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=batch.get("max_queue_size"),
            schedule_delay_millis=batch.get("schedule_delay_millis"),
            max_export_batch_size=batch.get("max_export_batch_size")))
        self.tracer = self.provider.get_tracer("naiad")
        # Stamps are monotonic; spans need wall-clock ns.
        self.offset = time.time_ns() - time.monotonic_ns()

    def begin(self, trace: Trace, parent: Trace | None) -> None:
        """Open the request's span now, so that its children's spans can hang under it: under
        the parent request's span, else under the client's (a propagated traceparent)."""
        from opentelemetry import trace as otel
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if parent is not None and parent.span is not None:
            context = otel.set_span_in_context(parent.span)
        else:
            context = TraceContextTextMapPropagator().extract(trace.context or {})
        attributes: dict[str, str | int] = {
            "triton.model_name": trace.model_name, "triton.model_version": trace.model_version,
            "triton.request_id": trace.request_id, "triton.trace_id": trace.id}
        if parent is not None:
            attributes["triton.parent_id"] = parent.id
        trace.span = self.tracer.start_span("InferRequest", context=context, attributes=attributes)

    def export(self, trace: Trace) -> None:
        from opentelemetry import trace as otel

        root = trace.span
        if root is None:
            return
        stamps = {name: ns + self.offset for name, ns in trace.timestamps}
        inside = otel.set_span_in_context(root)
        phases = (("queue", "QUEUE_START", "COMPUTE_START"), ("compute", "COMPUTE_START", "COMPUTE_END"))
        for name, begin, end in phases:
            if begin in stamps and end in stamps:
                span = self.tracer.start_span(name, context=inside, start_time=stamps[begin])
                if name == "compute":
                    for event in ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"):
                        if event in stamps:
                            span.add_event(event, timestamp=stamps[event])
                span.end(end_time=stamps[end])
        root.end(end_time=stamps.get("REQUEST_END"))

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what the batch processor still holds
