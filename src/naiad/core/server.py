"""InferenceServer: the one object every frontend calls (protocol-neutral data plane)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

import naiad
from naiad.config.model_config import config_from_json, config_to_json
from naiad.config.options import ServerOptions
from naiad.core.backend_host import BackendHost
from naiad.core.labels import LABELS_PARAMETER, REQUEST_PARAMETER, SPLIT_PARAMETER, VersionLabels, label_change
from naiad.core.lifecycle import ModelManager
from naiad.core.mailbox import Mailbox
from naiad.core.model import LoadedVersion
from naiad.core.residency import Residency, WaitingJob
from naiad.core.shared_memory import Region as Region  # re-exported: frontends reach the core here
from naiad.core.shared_memory import SharedMemoryRegistry
from naiad.errors import Cancelled, InvalidArgument, NaiadError, NotFound, Unavailable, Unsupported
from naiad.observability.custom_metrics import CustomMetrics
from naiad.observability.logs import LogSettings
from naiad.observability.metrics import ModelSample
from naiad.observability.tracing import Trace, Tracer
from naiad.scheduling.base import Job, ResponseSink
from naiad.types import InferRequest, InferResponse, TensorSpec

log = logging.getLogger(__name__)

DECOUPLED_ERROR = "this endpoint doesn't support models with decoupled transaction policy"
#: New requests from clients once a stop was asked for (requests of running ensembles and BLS
#: calls, which come through the backend host, still go through while the server drains).
STOPPING_ERROR = "the server is shutting down and accepts no new inference requests"

#: Triton 2.51's list, in its order (clients and tools probe it). schedule_policy: the `priority` and
#: `timeout` request parameters; cuda_shared_memory: its endpoints answer as a build without GPUs
#: does (no region, registration refused), and Triton lists it on such machines too.
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


class InferenceServer:
    """The data plane every frontend calls: infer (one response, streamed, or answered without
    a task), metadata, statistics, repository, shared memory, trace and log settings.

    Over 25 methods for a reason: one per KServe V2 / Triton API the frontends expose, each a thin
    call into the object that owns its state (Router, ModelManager, registries, Tracer).
    """

    def __init__(self, options: ServerOptions, log_settings: LogSettings | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.options = options
        self.models = ModelManager(options, host=BackendHost(self))
        # --model-load-on-demand / --model-memory-budget: loads on request, LRU evictions
        self.residency = Residency(self.models, options.model_memory_budget) if options.model_load_on_demand else None
        if self.residency is not None:
            self.models.on_unloaded = self.residency.forget
        self.tracer = Tracer(options.trace_settings, options.trace_opentelemetry)
        self.logging = log_settings or LogSettings()
        self.shared_memory = SharedMemoryRegistry(options.allow_client_shm)
        self.custom_metrics = CustomMetrics()  # families models create (pb_utils.MetricFamily)
        self.stopping = False
        self.started = False
        self.inflight = 0  # inference requests being served; shutdown drains them (event loop only)
        # The frontends' loop, where model processes' answers are read and the schedulers'
        # timers run (None: not serving; the timers then have a thread of their own). It is the
        # running loop of the thread constructing the server; that thread's id, kept, tells
        # "on the loop" without asyncio.get_running_loop() (a getpid() system call on 3.11).
        self.loop = loop
        self.loop_thread = threading.get_ident() if loop is not None else 0
        if loop is not None:
            self.models.services.timers.serve_on(loop)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the models the control mode asks for; raise when --exit-on-error and any failed."""
        names = self._startup_models()
        errors = self.models.load_many(names) if self.residency is None else self._load_resident(names)
        for error in errors.values():
            log.error("%s", error)
        if errors and self.options.exit_on_error:
            raise Unavailable("failed to load all models: " + ", ".join(sorted(errors)))
        self.started = True

    def _load_resident(self, names: list[str]) -> dict[str, str]:
        """Startup loads under a memory budget: one at a time, each measured."""
        assert self.residency is not None
        errors: dict[str, str] = {}
        for name in names:
            try:
                self.residency.load_now(name, functools.partial(self.models.load, name))
            except NaiadError as error:
                errors[name] = str(error)
        return errors

    def _startup_models(self) -> list[str]:
        found = self.models.discover()
        for name in found.duplicates:
            log.error("failed to load '%s': model appears in two or more repositories", name)
        if self.residency is not None and self.options.model_control_mode != "explicit":
            return []  # on demand: nothing loads before a request asks for it
        if self.options.model_control_mode != "explicit":
            return sorted(found.models)
        if list(self.options.load_models) == ["*"]:
            return sorted(found.models)
        return list(self.options.load_models)

    def stop(self, timeout: float | None = None) -> None:
        """Unload every model, waiting at most `timeout` seconds (--exit-timeout-secs by default)."""
        self.stopping = True
        if self.residency is not None:
            self.residency.close()  # loads not begun yet are cancelled: their requests fail
        self.models.stop_all(self.options.exit_timeout_secs if timeout is None else timeout)
        self.shared_memory.close()
        self.tracer.flush()

    # -- health and metadata -----------------------------------------------------------------

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        if not self.started or self.stopping:
            return False
        return self.models.all_ready() if self.options.strict_readiness else True

    def metadata(self) -> dict[str, Any]:
        return {"name": self.options.server_id, "version": naiad.__version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: int | None) -> bool:
        try:
            return self.models.get(name, version).is_ready()
        except NaiadError:
            return False

    def model_metadata(self, name: str, version: int | None) -> dict[str, Any]:
        loaded = self.models.get(name, version)
        versions = [version] if version is not None else self.models.serving_versions(name)
        config = loaded.config
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": config.platform or config.backend,
            "inputs": [_spec_json(s) for s in loaded.inputs],
            "outputs": [_spec_json(s) for s in loaded.outputs],
        }

    def model_config(self, name: str, version: int | None) -> dict[str, Any]:
        """The config as Triton's /config JSON."""
        return config_to_json(self.model_config_message(name, version))

    def model_config_message(self, name: str, version: int | None) -> mc.ModelConfig:
        """The config message itself (a copy: callers may not change the serving config)."""
        config = mc.ModelConfig()
        config.CopyFrom(self.models.get(name, version).config)
        labels = self.models.router.labels(name)
        if labels is not None or any(key in config.parameters for key in (LABELS_PARAMETER, SPLIT_PARAMETER)):
            # The labels in force, which a run-time change may have moved since the load.
            (labels or VersionLabels(name)).apply_to(config)
        return config

    def label_version(self, name: str, label: str, loaded_only: bool = False) -> int:
        """The version a label names (`loaded_only`: and that version serves)."""
        return self.models.router.label_version(name, label, loaded_only)

    def version_labels(self, name: str) -> dict[str, Any]:
        """A serving model's labels and split as JSON (empty when it has none)."""
        labels = self.models.router.labels(name)
        return (labels or VersionLabels(name)).as_dict()

    def model_inputs(self, name: str, version: int | None) -> tuple[list[TensorSpec], int]:
        """The model's inputs and its max_batch_size (for requests that carry no metadata)."""
        loaded = self.models.get(name, version)
        return loaded.inputs, loaded.config.max_batch_size

    # -- inference ---------------------------------------------------------------------------

    async def infer(self, request: InferRequest, decoupled_error: str = DECOUPLED_ERROR) -> InferResponse:
        """Run one request for exactly one response; errors before queueing raise, errors after
        come back in the response. Decoupled models are refused with `decoupled_error` (each
        frontend words it its own way)."""
        if self.stopping:
            raise Unavailable(STOPPING_ERROR)
        self.inflight += 1
        try:
            loop = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            future: asyncio.Future[InferResponse] = loop.create_future()

            def sink(response: InferResponse) -> None:
                if threading.get_ident() == loop_thread:  # answered on the loop itself: no wake-up
                    _resolve(future, response)
                else:
                    loop.call_soon_threadsafe(_resolve, future, response)

            job = self._submit(request, sink, decoupled_error)
            try:
                return await future
            except asyncio.CancelledError:
                job.cancel()  # the client went away: a queued job leaves the queue
                raise
        finally:
            self.inflight -= 1

    def infer_soon(self, request: InferRequest, answer: Callable[[InferResponse], None],
                   decoupled_error: str = DECOUPLED_ERROR) -> Callable[[], None]:
        """`infer` for a frontend answering without a task of its own: queue the request and have
        `answer` called with its one response on the event loop's thread (the caller's). Errors
        before queueing raise. Returns what cancels the request if the client goes away: its
        in-flight count ends then (a queued job that leaves its queue is never answered), and
        `answer` is not called after it."""
        return self._soon(request, _LoopSink(self, answer), decoupled_error)

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Every response to one request, for decoupled models and others alike; the last has
        `final` set. Errors before queueing raise before the first response."""
        responses: Mailbox[InferResponse] = Mailbox()
        cancel = self.stream_soon(request, responses.put)
        try:
            while True:
                response = await responses.get()
                yield response
                if response.final:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            cancel()
            raise

    def stream_soon(self, request: InferRequest, on_response: Callable[[InferResponse], None]) -> Callable[[], None]:
        """`stream` for a frontend without a task (or generator) per request: every response,
        a decoupled model's too, goes to `on_response` on the event loop's thread (the caller's),
        the last with `final` set. Errors before queueing raise. Returns what cancels the
        request; nothing reaches `on_response` after it."""
        return self._soon(request, _LoopSink(self, on_response), None)

    def _soon(self, request: InferRequest, sink: _LoopSink, decoupled_error: str | None) -> Callable[[], None]:
        """Count the request in flight until its final response reaches `sink` or it is
        cancelled, and queue it; returns the canceller."""
        if self.stopping:
            raise Unavailable(STOPPING_ERROR)
        self.inflight += 1
        try:
            job = self._submit(request, sink, decoupled_error)
        except BaseException:
            self.inflight -= 1
            raise
        if sink.open:  # not answered already (a cache hit, a quick execution on this thread)
            sink.job = job
        return sink.cancel

    def is_decoupled(self, name: str, version: int | None) -> bool:
        return bool(self.models.get(name, version).decoupled)

    def _submit(self, request: InferRequest, sink: ResponseSink, decoupled_error: str | None,
                may_load: bool = True) -> Job:
        parameters = request.parameters
        # The label is a routing instruction, taken out so that it never reaches the model (nor an
        # ensemble's steps, which share the parent's parameters).
        label = parameters.pop(REQUEST_PARAMETER, None) if parameters else None
        try:
            loaded, label = self.models.router.acquire(request.model_name, request.model_version, label, request.id)
        except NotFound:
            if self.residency is None or not may_load:
                raise
            return self._submit_cold(request, sink, decoupled_error, label)
        if self.residency is not None:
            self.residency.touch(loaded.name)
        if label is not None:
            sink = _LabelledSink(sink, label)
        if log.isEnabledFor(logging.DEBUG):  # per-request lines at --log-verbose only, never formatted otherwise
            log.debug("infer request '%s' for model '%s' version %d: inputs %s", request.id, loaded.name,
                      loaded.version, [(t.name, t.datatype.value, list(t.shape)) for t in request.inputs])
        try:
            if decoupled_error is not None and loaded.decoupled:
                raise Unsupported(decoupled_error)
            trace = self.tracer.start(loaded.name, loaded.version, request.id, request.trace_context,
                                      request.trace_parent)
            if trace is not None:
                if request.trace_stamps:
                    trace.timestamps.extend(request.trace_stamps)
                trace.stamp("REQUEST_START")
                trace.record("TENSOR_QUEUE_INPUT", request.inputs)
                request.trace = trace
                sink = _TracedSink(sink, trace, self.tracer, finish=not request.trace_held)
            return loaded.submit(request, sink, trace)
        except BaseException as error:
            loaded.release()
            if isinstance(error, NaiadError):
                # A full queue (Unavailable) rejects; a request that fails validation is OTHER.
                loaded.stats.record_failure(0, "REJECTED" if isinstance(error, Unavailable) else "OTHER")
            raise

    def _submit_cold(self, request: InferRequest, sink: ResponseSink, decoupled_error: str | None,
                     label: str | None) -> Job:
        """A request for a model that is not loaded (--model-load-on-demand): it waits for the
        load, then is submitted as any other; the returned job cancels it meanwhile."""
        assert self.residency is not None
        residency = self.residency
        if label is not None:
            request.parameters[REQUEST_PARAMETER] = label  # routed again once the model serves
        waiting = WaitingJob(request, sink)

        def loaded(load: Future[None]) -> None:
            residency.cold_start(request.model_name, time.monotonic_ns() - waiting.enqueued_ns)
            failure = Unavailable(STOPPING_ERROR) if load.cancelled() else load.exception()
            error = failure if failure is None or isinstance(failure, Exception) else Unavailable(str(failure))
            if error is None and waiting.cancelled:
                error = Cancelled("the request was cancelled while its model loaded")
            if error is None:
                try:  # on the residency thread: the slot is taken before anything could evict it
                    waiting.started = self._submit(request, sink, decoupled_error, may_load=False)
                    return
                except Exception as failure:
                    error = failure
            sink(InferResponse(request.model_name, str(request.model_version or ""), request.id, error=error))

        residency.ensure(request.model_name).add_done_callback(loaded)
        return waiting

    async def loaded(self, name: object) -> None:
        """With on-demand loading, wait until model `name` serves, loading it when the repository
        has it; at once otherwise. For frontends that need a model's config or inputs before
        they can decode a request (generate, the OpenAI routes): their own lookup then answers
        for names that are not models, in their own words."""
        if self.residency is None or not isinstance(name, str) or not name or self.models.router.serves(name):
            return
        try:
            await asyncio.wrap_future(self.residency.ensure(name, lookup=True))
        except NotFound:
            return

    # -- repository --------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.models.index(ready_only)

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Blocking: run it off the event loop."""
        self._require_explicit()
        override: mc.ModelConfig | None = None
        files: dict[str, bytes] = {}
        # Label changes (docs/version_labels.md): load parameters `version_labels` / `version_split`,
        # or a `config` holding nothing but those parameters; neither reloads a version.
        labels: dict[str, str] = {}
        for key, value in parameters.items():
            if key == "config":
                change = label_change(value)
                if change is None:
                    override = config_from_json(value)
                else:
                    labels.update(change)
            elif key.startswith("file:"):
                files[key[len("file:"):]] = value
            elif key in (LABELS_PARAMETER, SPLIT_PARAMETER):
                if not isinstance(value, str):
                    raise InvalidArgument(f"'{key}' parameter must be a string")
                labels[key] = value
        if override is not None or files or not labels:
            if self.residency is not None:  # room is made first, and the footprint measured
                self.residency.load_now(name, functools.partial(self.models.load, name, override, files or None))
            else:
                self.models.load(name, override, files or None)
        if labels:
            self.models.relabel(name, labels.get(LABELS_PARAMETER), labels.get(SPLIT_PARAMETER))

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Blocking: run it off the event loop."""
        self._require_explicit()
        self.models.unload(name, dependents=parameters.get("unload_dependents") is True)

    def _require_explicit(self) -> None:
        if self.options.model_control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    # -- statistics --------------------------------------------------------------------------

    def trace_settings(self, model: str | None, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace settings in force (global, or a model's), after applying `changes`."""
        if model is not None and model not in self.models.known_names():
            raise InvalidArgument(f"Request for unknown model : {model}")
        return self.tracer.get(model) if not changes else self.tracer.update(model, changes)

    def metric_samples(self) -> list[ModelSample]:
        """Every loaded version's counters and queue depth, for the metrics page."""
        return [ModelSample(loaded.stats, loaded.pending(), tuple(loaded.backend_metrics()))
                for loaded in self.models.loaded()]

    def statistics(self, name: str | None, version: int | None) -> dict[str, Any]:
        if name is None:
            versions = self.models.loaded()
        else:
            versions = self._ready_versions(name)
            if not versions:
                raise InvalidArgument(f"requested model '{name}' is not available")
            if version is not None:
                versions = [v for v in versions if v.version == version]
                if not versions:
                    raise InvalidArgument(f"requested model version is not available for model '{name}'")
        return {"model_stats": [v.stats.as_dict() for v in sorted(versions, key=_order)]}

    def _ready_versions(self, name: str) -> list[LoadedVersion]:
        try:
            return [self.models.get(name, v) for v in self.models.serving_versions(name)]
        except NotFound:  # unloaded between the two calls
            return []


class _LoopSink:
    """A job's sink that answers on the event loop's thread: directly when the response comes
    from that thread (a model process's answer, read by the loop), else by a wake-up. The
    request's in-flight count ends once, at its final response or at `cancel()` (the client went
    away), whichever comes first; nothing is answered after that."""

    __slots__ = ("answer", "job", "loop", "open", "server", "thread")

    def __init__(self, server: InferenceServer, answer: Callable[[InferResponse], None]) -> None:
        self.server = server
        self.answer = answer
        self.open = True
        self.job: Job | None = None  # set once queued
        self.thread = threading.get_ident()
        loop = server.loop
        self.loop = loop if loop is not None and self.thread == server.loop_thread else asyncio.get_running_loop()

    def __call__(self, response: InferResponse) -> None:
        if threading.get_ident() == self.thread:  # `deliver`, inline (once per request)
            if self.open:
                if response.final:
                    self._close()
                self.answer(response)
        else:
            self.loop.call_soon_threadsafe(self.deliver, response)

    def deliver(self, response: InferResponse) -> None:
        if not self.open:
            return
        if response.final:
            self._close()
        self.answer(response)

    def cancel(self) -> None:
        """On the event loop's thread. A finished job is not cancelled: that would send
        schedulers scanning their queues for it."""
        job = self.job
        if self.open:
            self._close()
            if job is not None:
                job.cancel()  # a queued job leaves its queue (unanswered), a running one stops

    def _close(self) -> None:
        self.open = False
        self.job = None  # the job holds this sink: without the cycle its objects go by reference counting
        self.server.inflight -= 1


class _LabelledSink:
    """A sink adding the label that routed the request to each response's parameters (A/B
    analyses join on it); a new dict, since a cached response's parameters are shared."""

    __slots__ = ("label", "sink")

    def __init__(self, sink: ResponseSink, label: str) -> None:
        self.sink = sink
        self.label = label

    def __call__(self, response: InferResponse) -> None:
        response.parameters = {**response.parameters, REQUEST_PARAMETER: self.label}
        self.sink(response)


def _order(loaded: LoadedVersion) -> tuple[str, int]:
    return loaded.name, loaded.version


def _resolve(future: asyncio.Future[InferResponse], response: InferResponse) -> None:
    if not future.done():
        future.set_result(response)


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype.value, "shape": list(spec.shape)}


class _TracedSink:
    """A sink stamping the trace's end at the final response; `finish` hands the trace to the
    writer then (else the frontend does, once its reply is sent)."""

    __slots__ = ("finish", "sink", "trace", "tracer")

    def __init__(self, sink: ResponseSink, trace: Trace, tracer: Tracer, finish: bool) -> None:
        self.sink = sink
        self.trace = trace
        self.tracer = tracer
        self.finish = finish

    def __call__(self, response: InferResponse) -> None:
        trace = self.trace
        if response.outputs:
            trace.record("TENSOR_BACKEND_OUTPUT", response.outputs)
        if response.final:
            # Both before the sink: once it runs, the frontend may send and end the trace.
            trace.stamp("REQUEST_END")
            trace.stamp("INFER_RESPONSE_COMPLETE")
        self.sink(response)
        if response.final and self.finish:
            self.tracer.finish(trace)
