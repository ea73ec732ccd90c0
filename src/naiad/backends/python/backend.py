"""The "python" backend: Triton model.py files, one model process per instance.

The server side of each instance turns a batch into one `Execute` message (inputs written once
into shared memory), and the model process's messages back into responses: `Executed` when
`execute` returned, `Sent` for responses from response senders. A decoupled instance is free for
the next batch as soon as `execute` returns; its requests stay open until their final response.
BLS calls from the model come in as `BlsCall` and go to the server through `Model.host`.

When the model process dies, the requests it held fail with Triton's "Stub process ... is not
healthy" error and a new process is started for the requests that follow.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    Batch,
    BatchSender,
    ExecutionTimes,
    Model,
    ModelInstance,
    ParameterizedOutputs,
    RequestResult,
)
from naiad.backends.python import messages as p
from naiad.backends.python.custom_metrics import InstanceMetrics
from naiad.backends.python.environment import python_for
from naiad.backends.python.process import StubProcess, log_from_model
from naiad.config.model_config import config_from_json, config_to_json
from naiad.errors import InternalError, InvalidArgument, NaiadError, Status, Unavailable
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

log = logging.getLogger("naiad.backends.python")

DEFAULT_STUB_TIMEOUT_S = 30.0
# Batches the default scheduler may hand a model process at once: they ride in one write and the
# process runs them back to back without sleeping in between (each reports its own start, so
# their queue time still ends when they start executing). Batching schedulers hand over one at a
# time: a request stays queued, under the queue policy, until its batch executes.
PIPELINE_DEPTH = 8
READY_REFRESH_S = 1.0
RESTART_BACKOFF_S = 1.0  # after a failed restart; doubles with each failure
RESTART_BACKOFF_MAX_S = 60.0
# Request parameters the server itself interprets; the model sees the others (as in Triton).
_RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                  "binary_data_output", "headers"})
_KINDS = {mc.ModelInstanceGroup.KIND_CPU: "CPU", mc.ModelInstanceGroup.KIND_GPU: "GPU",
          mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}


class PythonModel(Model):
    backend_name = "python"

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.model_file = version_dir / (config.default_model_filename or "model.py")
        if not self.model_file.is_file():
            raise InvalidArgument(f"unable to find '{self.model_file}' for model '{config.name}'")
        self.model_dir = version_dir.parent

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        """Run the model's static `auto_complete_config` in a model process of its own, as Triton does."""
        model_file = version_dir / (config.default_model_filename or "model.py")
        if not model_file.is_file() or "auto_complete_config" not in model_file.read_text(errors="replace"):
            return False  # nothing to ask: skip starting a process
        settings = dict(options.get("backend_config", {}))
        python, env = python_for(config, version_dir.parent)
        process = StubProcess(f"{config.name}-autocomplete", python, env)
        process.start()
        try:
            answer = process.handshake(p.AutoComplete(str(model_file), json.dumps(config_to_json(config))),
                                       _stub_timeout(settings))
        finally:
            process.stop(5.0)
        assert isinstance(answer, p.AutoCompleted)
        if answer.error is not None:
            raise InvalidArgument(answer.error.split("\n", 1)[0])
        if answer.config is not None:
            completed = config_from_json(json.loads(answer.config))
            config.CopyFrom(completed)
        return False

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        device = group.gpus[index % len(group.gpus)] if group.gpus else 0
        name = f"{group.name}_{index}"
        args = {
            "model_config": json.dumps(config_to_json(self.config)),
            "model_instance_kind": _KINDS.get(group.kind, "CPU"),
            "model_instance_name": name,
            "model_instance_device_id": str(device),
            "model_repository": str(self.model_dir),
            "model_version": str(self.version),
            "model_name": self.config.name,
        }
        settings = dict(self.backend_settings())
        return PythonInstance(self, name, args, _stub_timeout(settings))

    def backend_settings(self) -> Mapping[str, str]:
        return self.host.backend_config("python") if self.host is not None else {}


def _stub_timeout(settings: Mapping[str, str]) -> float:
    value = settings.get("stub-timeout-seconds")
    return float(value) if value else DEFAULT_STUB_TIMEOUT_S


class _Pending:
    """A batch in the model process: which requests still wait for their final response."""

    __slots__ = ("batch", "batch_id", "executed", "open", "sender")

    def __init__(self, batch_id: int, batch: Batch, sender: BatchSender) -> None:
        self.batch_id = batch_id
        self.batch = batch
        self.sender = sender
        self.open = set(range(len(batch.requests)))
        self.executed = False  # execute returned in the model process


class PythonInstance(ModelInstance):
    """Answers come from the process's reader (the server's event loop). model.py gets each
    request's own tensors, never a concatenation."""

    depth = PIPELINE_DEPTH

    def __init__(self, model: PythonModel, name: str, args: dict[str, str], stub_timeout: float) -> None:
        self.model = model
        self.name = name
        self.args = args
        self.decoupled = model.config.model_transaction_policy.decoupled
        self.stub_timeout = stub_timeout
        self.output_names = [o.name for o in model.config.output]
        self._ids = itertools.count(1)
        self._newest = 0  # the id of the last batch submitted
        self._pending: dict[int, _Pending] = {}
        self._calls: dict[int, Callable[[], None]] = {}  # BLS call -> cancel
        # Traces of the traced requests sent to the model, by id, while anything holds them.
        self._traces: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._healthy = threading.Condition(self._lock)
        self._on_room: Callable[[], None] | None = None  # the scheduler, once a restarted process is up
        # Host.call_soon: what the event loop sends a process in one turn goes out in one write
        self._call_soon = model.host.call_soon if model.host is not None else None
        self._closing = False
        self._restarting = False
        self._failed_restarts = 0
        self._next_restart = 0.0  # monotonic time before which no restart is tried
        # is_ready() of the model, when it defines one: the last answer, asked again in the
        # background when older than READY_REFRESH_S (readiness probes must not wait on a model)
        self._probes_ready = False
        self._ready = True
        self._ready_asked = 0.0
        self._process: StubProcess | None = None
        self._python, self._env = python_for(model.config, model.model_dir)
        self._custom_metrics = InstanceMetrics.for_host(model.host, name)  # pb_utils.MetricFamily
        self._start()

    # -- process lifecycle -------------------------------------------------------------------

    def _start(self) -> None:
        """Start a model process and initialize the model; raises with the model's message."""
        process = StubProcess(self.name, self._python, self._env)
        process.start()
        try:
            ready = process.handshake(p.Init(str(self.model.model_file), self.args, self.decoupled),
                                      self.stub_timeout)
        except BaseException:
            process.kill()
            raise
        assert isinstance(ready, p.Ready)
        if ready.error is not None:
            process.kill()
            first_line, _, detail = ready.error.partition("\n")
            log.error("initialize of model '%s' failed:\n%s", self.name, detail)
            raise InternalError(first_line)
        with self._lock:
            self._process = process
            self._probes_ready = ready.probes_ready
            self._healthy.notify_all()
        host = self.model.host
        process.run(self._on_message, lambda: self._on_exit(process), host.watch if host is not None else None,
                    host.watch_writable if host is not None else None)

    def _on_exit(self, process: StubProcess) -> None:
        """The model process is gone: fail what it held, then start a new one (unless closing)."""
        with self._lock:
            if self._process is process:
                self._process = None
            pending, self._pending = self._pending, {}
            calls, self._calls = self._calls, {}
            closing = self._closing
            # Claimed before the held requests fail: a request sent as soon as they do must find
            # the restart under way and wait for it, not find no process and no restart.
            restart = not closing and self._claim_restart()
        code = _exit_code(process)
        error = self._exit_error(code)
        for item in pending.values():
            self._mark_executed(item)
            self._fail_open(item, error)
        for cancel in calls.values():
            cancel()
        process.close()
        if closing:
            return
        log.error("the model process of '%s' exited (code %s); starting a new one", self.name, code)
        if restart:
            self._start_restart()

    def _exit_error(self, code: int | None) -> NaiadError:
        """What the requests held by a model process that died fail with (`code`: its exit
        status, negative for a signal, None if unknown); other backends built on this one say more."""
        return InternalError(f"Failed to process the request(s) for model instance '{self.name}', "
                             f"message: Stub process '{self.name}' is not healthy.")

    def _restart_soon(self) -> None:
        """Start a new process on a thread of its own: starting takes a while and this may be the
        server's event loop. One restart at a time; after failed ones, the next waits longer
        (requests meanwhile fail at once), so a model that cannot start does not spin."""
        with self._lock:
            if not self._claim_restart():
                return
        self._start_restart()

    def _claim_restart(self) -> bool:
        """Under the lock: whether this caller starts the restart now (marking it under way)."""
        if self._restarting or self._closing or time.monotonic() < self._next_restart:
            return False
        self._restarting = True
        return True

    def _start_restart(self) -> None:
        threading.Thread(target=self._restart, name=f"{self.name}-restart", daemon=True).start()

    def _restart(self) -> None:
        try:
            self._start()
            self._failed_restarts = 0
        except Exception as failure:
            self._failed_restarts += 1
            delay = min(RESTART_BACKOFF_S * 2 ** (self._failed_restarts - 1), RESTART_BACKOFF_MAX_S)
            self._next_restart = time.monotonic() + delay
            log.error("restarting the model process of '%s' failed (next try in %g s): %s",
                      self.name, delay, failure)
        finally:
            with self._lock:
                self._restarting = False
            if self._on_room is not None:
                self._on_room()  # queued batches start on the new process, or fail without one

    def close(self) -> None:
        with self._lock:
            self._closing = True
            process = self._process
            self._healthy.notify_all()
        if process is not None:
            process.stop(self.stub_timeout)
        self._custom_metrics.close()

    # -- execution ---------------------------------------------------------------------------

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        process = self._process
        if process is None:
            if self._restarting:
                return False  # the restart reports room when the new process is up
            self._restart_soon()
            raise Unavailable(f"Stub process '{self.name}' is not healthy.")
        batch_id = self._newest = next(self._ids)
        pending = _Pending(batch_id, batch, sender)
        try:
            room = p.InlineRoom()  # one Execute message
            batched = batch.requests
            requests = ([self._request(process, batched[0], room)] if len(batched) == 1  # (no comprehension's call)
                        else [self._request(process, request, room) for request in batched])
            self._pending[batch_id] = pending  # one dict store: atomic, and _on_exit swaps the dict under the lock
            execute = p.Execute(batch_id, requests, process.take_frees())
            if len(self._pending) == 1:
                # The model process has nothing else to execute: the batch goes out now, and the
                # rest of this turn (the request's bookkeeping, other reads) overlaps its
                # execution instead of preceding it. One request at a time (c=1) waits that much
                # less. A busy process gets it with whatever else this turn sends it, in one write.
                process.send_now(execute)
            else:
                process.send_soon(execute, self._call_soon)
        except BaseException as error:
            with self._lock:
                self._pending.pop(batch_id, None)
                owned, pending.executed = not pending.executed, True  # else the process's exit answered it
            if not owned:
                return True
            if isinstance(error, p.ChannelClosed):
                raise Unavailable(f"Stub process '{self.name}' is not healthy.") from None
            raise
        return True

    def is_ready(self) -> bool:
        process = self._process
        if process is None:
            return False
        if self._probes_ready and time.monotonic() - self._ready_asked > READY_REFRESH_S:
            self._ready_asked = time.monotonic()
            with contextlib.suppress(p.ChannelClosed, NaiadError):
                process.send(p.Query(0, "is_ready", []))
        return self._ready

    def set_on_room(self, callback: Callable[[], None]) -> None:
        self._on_room = callback

    def _request(self, process: StubProcess, request: InferRequest, room: p.InlineRoom) -> p.Request:
        parameters = request.parameters
        correlation_id, flags, timeout, custom = 0, 0, 0, "{}"
        if parameters:
            correlation_id = parameters.get("sequence_id", 0)
            flags = (1 if parameters.get("sequence_start") else 0) | (2 if parameters.get("sequence_end") else 0)
            timeout = int(parameters.get("timeout", 0))
            passed = {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS}
            if passed:
                custom = json.dumps(passed)
        outputs = [o.name for o in request.outputs] if request.outputs is not None else self.output_names
        trace = 0
        if request.trace is not None:  # BLS calls made with request.trace() join it (see _bls)
            trace = request.trace.id
            self._traces[trace] = request.trace
        arena = process.arena
        assert arena is not None  # set when the process started
        inputs = []
        for tensor in request.inputs:  # (a loop: no comprehension's call per request)
            inputs.append(p.tensor_ref(arena, tensor.name, tensor.datatype, tensor.data, room))
        return p.Request(request.id, correlation_id, flags, timeout, custom, outputs, inputs, trace)

    # -- messages from the model process (reader thread) -------------------------------------

    def _on_message(self, message: Any) -> None:
        if isinstance(message, p.Executed):
            if message.frees:  # (rarely: small tensors travel inline)
                self._free(message.frees)
            self._on_executed(message)
        elif isinstance(message, p.Sent):
            self._free(message.frees)
            process = self._process
            for response in message.responses:
                pending = self._pending.get(response.batch)
                if pending is not None:
                    self._deliver(pending, response, process)
                    self._forget_if_done(pending)
            if process is not None:
                process.flush_frees()
        elif isinstance(message, p.BlsCall):
            self._free(message.frees)
            self._bls(message)
        elif isinstance(message, p.BlsCancel):
            cancel = self._calls.pop(message.call, None)
            if cancel is not None:
                cancel()
        elif isinstance(message, p.Query):
            self._query(message)
        elif isinstance(message, p.Answer):  # to the server's is_ready question
            self._ready = bool(message.value)
        elif isinstance(message, p.Log):
            log_from_model(self.name, message)
        elif isinstance(message, p.Frees):
            self._free(message.frees)
        elif isinstance(message, p.CustomMetrics | p.MetricValue):
            self._custom_metrics.handle(message, self._process)

    def _free(self, flat: list[int]) -> None:
        process = self._process
        if flat and process is not None and process.arena is not None:
            for segment, offset in p.pairs(flat):
                process.arena.free(segment, offset)

    def _on_executed(self, message: p.Executed) -> None:
        pending = self._pending.get(message.batch)
        if pending is None:
            return
        times = message.times
        newest = self._newest
        self._mark_executed(pending, ExecutionTimes(*times) if len(times) == 4 else None)
        process = self._process
        # (one batch pending: only the one just answered; any other came after `newest` was read)
        if process is not None and (len(self._pending) == 1 or self._idle_before(newest)):
            # The model process has nothing left to execute but what the scheduler just gave it:
            # that goes out now, not at the end of this turn of the loop, and the model computes
            # it while the responses below are encoded and written (py_mlp at c=8 and 32: up to
            # 10 % more inferences/s and 8 % less CPU each; docs/benchmarks.md, 2026-12-05
            # 20:34). A process still busy with earlier batches gets it with whatever else this
            # turn sends it, in one write (py_identity c=32 lost a quarter of its inferences/s
            # to flushing every time).
            process.flush()
        for response in message.responses:
            self._deliver(pending, response, process)
        if pending.open:
            if message.error is not None:
                self._fail_open(pending, InternalError(message.error))
            elif not self.decoupled:
                self._fail_open(pending, InternalError(
                    f"model '{self.model.config.name}' returned no response for a request: execute must return "
                    "one InferenceResponse per request or send it through the request's response sender"))
        if not pending.open and pending.executed:  # `_forget_if_done`, inline (once per batch)
            self._pending.pop(pending.batch_id, None)

    def _idle_before(self, newest: int) -> bool:
        """Whether every batch up to id `newest` has executed (a snapshot: other threads may submit)."""
        pending = self._pending
        return all(other.executed or other.batch_id > newest for other in list(pending.values()))

    def _mark_executed(self, pending: _Pending, times: ExecutionTimes | None = None) -> None:
        """The model is done executing the batch (or its process died): the scheduler may give
        this instance its next batch."""
        with self._lock:
            if pending.executed:
                return
            pending.executed = True
        if times is None:
            times = ExecutionTimes.instant(time.monotonic_ns())
        pending.sender.executed(times)

    def _deliver(self, pending: _Pending, response: p.Response, process: StubProcess | None) -> None:
        index = response.index
        if index not in pending.open:
            return  # already answered: the first final response stands
        result: RequestResult | None
        if response.error is not None:
            result = NaiadError(response.error, _status(response.code))
        elif response.outputs or not response.final or not self.decoupled:
            result = _outputs(process, response) if process is not None else InternalError("model process gone")
        else:
            result = None  # a flags-only final response
        if response.final:
            pending.open.discard(index)
        pending.sender.send(index, result, response.final)

    def _fail_open(self, pending: _Pending, error: NaiadError) -> None:
        for index in sorted(pending.open):
            pending.sender.send(index, error, True)
        pending.open.clear()

    def _forget_if_done(self, pending: _Pending) -> None:
        if not pending.open and pending.executed:
            self._pending.pop(pending.batch_id, None)  # atomic; a dead process's dict may be gone already

    def _query(self, message: p.Query) -> None:
        if message.op == "is_cancelled":
            batch_id, index = message.args
            pending = self._pending.get(batch_id)
            cancelled = pending is not None and pending.batch.is_cancelled(index)
            self._answer(p.Answer(message.call, cancelled))
            return
        # model control waits for loads: never on the reader thread
        threading.Thread(target=self._control, args=(message,), daemon=True, name=f"{self.name}-control").start()

    def _control(self, message: p.Query) -> None:
        host = self.model.host
        try:
            if host is None:
                raise Unavailable("model control is not available")
            value = host.control(message.op, list(message.args))
            answer = p.Answer(message.call, value)
        except Exception as error:
            answer = p.Answer(message.call, None, str(error) or type(error).__name__)
        self._answer(answer)

    def _answer(self, answer: p.Answer) -> None:
        process = self._process
        if process is not None:
            with contextlib.suppress(p.ChannelClosed):
                process.send(answer)

    # -- BLS ---------------------------------------------------------------------------------

    def _bls(self, call: p.BlsCall) -> None:
        process = self._process
        host = self.model.host
        if process is None:
            return
        call_id = call.call

        def reply(response: InferResponse) -> None:
            current = self._process
            if current is not process:
                return  # the caller's process is gone
            if response.final:
                self._calls.pop(call_id, None)
            with contextlib.suppress(p.ChannelClosed, NaiadError):
                process.send(p.BlsReply(call_id, _bls_response(process, call_id, response), process.take_frees()))

        if host is None:
            reply(_error_response(call, Unavailable("BLS is not available")))
            return
        try:
            request = _bls_request(process, call)
            if call.request.trace:
                request.trace_parent = self._traces.get(call.request.trace)
            cancel = host.submit(request, reply, call.decoupled)
        except NaiadError as error:
            reply(_error_response(call, error))
            return
        self._calls[call_id] = cancel


def _exit_code(process: StubProcess) -> int | None:
    if process.process is None:
        return None
    try:
        return process.process.wait(0.5)  # it is exiting: its socket just closed
    except subprocess.TimeoutExpired:
        return None


def _status(name: str) -> Status:
    try:
        return Status(name)
    except ValueError:
        return Status.INTERNAL


_NUMPY_TYPES = {datatype.value: datatype.numpy for datatype in DataType}  # by wire name, no enum call


def _array(process: StubProcess, ref: p.TensorRef) -> np.ndarray:
    return p.tensor_array(process.segments, ref, _NUMPY_TYPES[ref.datatype])


def _outputs(process: StubProcess, response: p.Response) -> ParameterizedOutputs:
    outputs = ParameterizedOutputs()
    segments = process.segments
    for ref in response.outputs:  # a loop over _array's body: two calls fewer per response
        outputs[ref.name] = p.tensor_array(segments, ref, _NUMPY_TYPES[ref.datatype])
    if response.parameters and response.parameters != "{}":
        outputs.parameters = json.loads(response.parameters)
    return outputs


def _bls_request(process: StubProcess, call: p.BlsCall) -> InferRequest:
    request = call.request
    parameters: dict[str, Any] = json.loads(request.parameters) if request.parameters else {}
    if request.correlation_id:
        parameters["sequence_id"] = request.correlation_id
    if request.flags & 1:
        parameters["sequence_start"] = True
    if request.flags & 2:
        parameters["sequence_end"] = True
    if request.timeout:
        parameters["timeout"] = request.timeout
    inputs = []
    for ref in request.inputs:
        try:
            datatype = DataType(ref.datatype)
        except ValueError:
            raise InvalidArgument(f"unsupported datatype '{ref.datatype}' for input '{ref.name}'") from None
        inputs.append(Tensor(ref.name, datatype, tuple(ref.shape), _array(process, ref)))
    outputs = [RequestedOutput(name) for name in request.outputs] or None
    version = call.model_version if call.model_version > 0 else None
    return InferRequest(call.model_name, version, inputs, outputs, request.id, parameters)


def _bls_response(process: StubProcess, call: int, response: InferResponse) -> p.Response:
    if response.error is not None:
        error = response.error
        status = error.status.value if isinstance(error, NaiadError) else "INTERNAL"
        return p.Response(call, 0, [], str(error), status, final=response.final)
    arena = process.arena
    assert arena is not None  # set when the process started
    room = p.InlineRoom()  # one BlsReply message
    outputs = [p.tensor_ref(arena, t.name, t.datatype, t.data, room) for t in response.outputs]
    parameters = json.dumps(response.parameters) if response.parameters else "{}"
    return p.Response(call, 0, outputs, parameters=parameters, final=response.final)


def _error_response(call: p.BlsCall, error: Exception) -> InferResponse:
    return InferResponse(call.model_name, str(call.model_version), call.request.id, error=error)
