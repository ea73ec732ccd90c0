"""The model process: runs one instance of a Triton `model.py` (`python -m ... stub FD`).

The server starts one of these per model instance with one end of a Unix socket pair as FD.
The main thread reads the socket and runs the batches it reads itself; a standby thread reads
while the main thread executes and some thread waits for an answer (see `Stub.serve`). `async def
execute` coroutines run on an asyncio loop of their own; for decoupled models nothing waits for
them, so several batches can be in flight, as in Triton.

Imports only the standard library, numpy, msgspec, its sibling modules and `naiad.channel`, so
it also runs under a model's own environment (EXECUTION_ENV_PATH).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import inspect
import itertools
import json
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

from naiad.backends.python import messages as p
from naiad.backends.python import pb_metrics, pb_utils
from naiad.backends.python import stub_codes as codes
from naiad.backends.python.pb_tensor import Tensor
from naiad.backends.python.shm import Arena, PendingFrees, SegmentMap
from naiad.backends.python.stub_metrics import MetricsSender


class _Handle:
    """What a received request's response sender points at."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: int, index: int) -> None:
        self.batch = batch
        self.index = index


class _BlsStream:
    """The iterator `exec(decoupled=True)` returns: responses as the called model sends them."""

    def __init__(self, stub: Stub, call: int, responses: queue.SimpleQueue[Any]) -> None:
        self._stub = stub
        self._call = call
        self._responses = responses
        self._done = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        response, final = self._responses.get()
        if final:
            self._done = True
            self._stub.forget_call(self._call)
        return response

    def cancel(self) -> None:
        self._stub.channel.send(p.BlsCancel(self._call))


class Stub:
    """The model process's side of the channel; also pb_utils' runtime.

    Over 25 methods for a reason: one reader of the socket serves both the server's execute
    requests and the answers to the model's own calls (BLS, model control, metrics, logging),
    and the pb_utils calls wait on that reader; splitting them would share the read loop's
    state between two classes.
    """

    def __init__(self, channel: p.Channel) -> None:
        self.channel = channel
        self.frees = PendingFrees()  # the server's allocations we are done with
        self.segments = SegmentMap(self.frees)
        self.arena = Arena(f"naiad-stub-{os.getpid()}", self._announce)
        self._read_lock = threading.Lock()  # one thread reads the socket at a time
        self._calls_waiting = threading.Condition()  # wakes the standby reader
        self._outbox: list[p.Executed] = []  # answers held while more work is already buffered
        self._outbox_lock = threading.Lock()
        # A plain lock guards _exec_busy and _backlog (taken twice per batch); the condition over
        # it is waited on once, by serve() at the end, and notified only then.
        self._exec_lock = threading.Lock()
        self._exec_idle = threading.Condition(self._exec_lock)
        self._exec_busy = False
        self._awaiting_idle = False
        self._backlog: collections.deque[p.Execute] = collections.deque()
        self._calls: dict[int, Any] = {}  # BLS call id -> Future (one response) / queue (a stream)
        self._queries: dict[int, Future[p.Answer]] = {}  # query call id -> its answer
        self._call_ids = itertools.count(1)
        self.model: Any = None
        self.decoupled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.down = False
        self.serving = False  # the server's answers are read (serve() runs)
        self.metrics = MetricsSender(channel, lambda: self.down)  # custom metrics, ahead of our messages

    # -- start-up ----------------------------------------------------------------------------

    def load(self, model_file: str) -> Any:
        """Import model.py with its directory on sys.path (Triton does the same) and return
        its TritonPythonModel class."""
        directory = os.path.dirname(model_file)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        spec = importlib.util.spec_from_file_location("model", model_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {model_file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        return module.TritonPythonModel

    def initialize(self, message: p.Init) -> None:
        self.decoupled = message.decoupled
        cls = self.load(message.model_file)
        self.model = cls()
        if hasattr(self.model, "initialize"):
            result = self.model.initialize(dict(message.args))
            if inspect.isawaitable(result):
                self.run_coroutine(result).result()

    def run_coroutine(self, coroutine: Any) -> Future[Any]:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="model-asyncio", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    # -- the two threads --------------------------------------------------------------------

    def serve(self) -> None:
        """Read and handle messages until the server says goodbye, then wait for a running execute.

        The main thread reads a message and handles it itself: it runs the `Execute` batches it
        reads, so the thread that wakes up for a request is the one that answers it, with no
        hand-off between threads. While it executes, nobody reads — unless some thread waits for
        an answer from the server (BLS, is_cancelled, model control): then the standby thread takes
        over reading until no call is outstanding. Whichever thread reads an `Execute` runs it,
        one batch at a time in arrival order (see `_run_or_queue`)."""
        standby = threading.Thread(target=self._standby, name="model-io", daemon=True)
        standby.start()
        self.serving = True
        while self._read_one():
            pass
        with self._exec_idle:
            self._awaiting_idle = True
            self._exec_idle.wait_for(lambda: not self._exec_busy)

    def _standby(self) -> None:
        while not self.down:
            with self._calls_waiting:
                self._calls_waiting.wait_for(lambda: self._waiting_for_answers() or self.down)
            if not self._read_one(only_for_calls=True):
                return

    def _waiting_for_answers(self) -> bool:
        return bool(self._calls or self._queries)

    def _expect_answer(self) -> None:
        """A call was just registered: make sure someone reads its answer."""
        with self._calls_waiting:
            self._calls_waiting.notify()

    def _read_one(self, only_for_calls: bool = False) -> bool:
        """Read one message and handle it; False once the channel is closed."""
        channel = self.channel
        with self._read_lock:
            if self.down:
                return False
            if only_for_calls and not self._waiting_for_answers():
                return True  # answered while this thread waited for the lock
            try:
                message = channel.recv()
            except p.ChannelClosed:
                self._gone()
                return False
            if isinstance(message, p.Segment):  # its descriptor is next in the channel's queue
                self.segments.add(message.segment, channel.take_fd(), message.size)
                return True
        if isinstance(message, p.Execute):
            self._free(message.frees)
            self._run_or_queue(message)
        elif isinstance(message, p.BlsReply):
            self._free(message.frees)
            self._bls_reply(message)
        elif isinstance(message, p.Answer):
            answered = self._queries.pop(message.call, None)
            if answered is not None:
                answered.set_result(message)
        elif isinstance(message, p.Frees):
            self._free(message.frees)
        elif isinstance(message, p.Query):  # the server asks is_ready()
            self.channel.send(p.Answer(message.call, self._is_ready()))
        elif isinstance(message, p.MetricRejected):
            pb_metrics.reject(message.family, message.series, message.error)
        elif isinstance(message, p.Shutdown):
            self._gone()
            return False
        if self._outbox and not self.channel.has_frame():
            self._flush()
        return True

    def _run_or_queue(self, message: p.Execute) -> None:
        """Execute batches one at a time, in the order they were read."""
        lock = self._exec_lock
        with lock:
            if self._exec_busy:
                self._backlog.append(message)
                return
            self._exec_busy = True
        while True:
            self._execute(message)
            with lock:
                if not self._backlog:
                    self._exec_busy = False
                    if self._awaiting_idle:
                        self._exec_idle.notify_all()
                    return
                message = self._backlog.popleft()

    def _gone(self) -> None:
        """The server closed the channel (or said Shutdown): stop reading, unblock waiters."""
        self.down = True
        with contextlib.suppress(p.ChannelClosed):
            self._flush()
        with contextlib.suppress(OSError):
            self.channel.sock.shutdown(socket.SHUT_RD)  # the other thread's recv returns at once
        with self._calls_waiting:
            self._calls_waiting.notify_all()
        gone = "the server closed the connection"
        for query in list(self._queries.values()):  # nobody will answer these any more
            if not query.done():
                query.set_result(p.Answer(0, error=gone))
        for pending in list(self._calls.values()):
            failed = pb_utils.InferenceResponse(error=pb_utils.TritonError(gone, pb_utils.TritonError.UNAVAILABLE))
            if isinstance(pending, queue.SimpleQueue):
                pending.put((failed, True))
            elif not pending.done():
                pending.set_result(failed)

    def _is_ready(self) -> bool:
        try:
            return bool(self.model.is_ready())
        except Exception:  # a model that cannot tell is not ready
            traceback.print_exc()
            return False

    def _free(self, flat: list[int]) -> None:
        if not flat:
            return  # (most messages: small tensors travel inline and take no arena space)
        for segment, offset in p.pairs(flat):
            self.arena.free(segment, offset)

    def _bls_reply(self, message: p.BlsReply) -> None:
        target = self._calls.get(message.call)
        response = self._to_response(message.response)
        if isinstance(target, queue.SimpleQueue):
            target.put((response, message.response.final))
        elif target is not None:
            self._calls.pop(message.call, None)
            target.set_result(response)

    # -- executing ---------------------------------------------------------------------------

    def _execute(self, message: p.Execute) -> None:
        start = time.monotonic_ns()
        batch = message.batch
        requests = [self._to_request(batch, i, r) for i, r in enumerate(message.requests)]
        count = len(requests)
        wanted = [r.outputs for r in message.requests]  # outputs nobody asked for never cross over
        times = [start, time.monotonic_ns()]
        try:
            result = self.model.execute(requests)
        except BaseException as error:
            self._executed(batch, [], error, times)
            return
        if type(result) is not list and inspect.isawaitable(result):  # (a list: the common case, quickly)
            future = self.run_coroutine(result)
            if self.decoupled:  # responses go through the senders: free the instance at once
                self._executed(batch, [], None, times)
                future.add_done_callback(lambda done: self._async_failed(batch, count, done))
                return
            try:
                result = future.result()
            except BaseException as error:
                self._executed(batch, [], error, times)
                return
        times.append(time.monotonic_ns())
        del requests  # their inputs go back to the server as soon as the model drops them too
        self._executed(batch, self._returned(batch, wanted, result), None, times)

    def _returned(self, batch: int, wanted: list[list[str]], result: Any) -> list[p.Response] | BaseException:
        """The responses `execute` returned, checked as Triton checks them. Requests answered
        through their response sender already are answered again here only if the model returned
        a response for them too; the server keeps the first final response."""
        if self.decoupled:
            if result is not None:
                return pb_utils.TritonModelException(
                    "Python model is using the decoupled mode and the execute function must return None.")
            return []
        if result is None:
            return []  # answered through response senders, or not at all (the server checks)
        if not isinstance(result, list | tuple):
            return pb_utils.TritonModelException("Expected a list in the execute return")
        count = len(wanted)
        if len(result) != count:
            return pb_utils.TritonModelException(
                "Number of InferenceResponse objects do not match number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{count}, and InferenceResponse(s) size is:{len(result)}")
        responses = []
        room = p.InlineRoom()  # one Executed message
        for index, response in enumerate(result):
            if not isinstance(response, pb_utils.InferenceResponse):
                return pb_utils.TritonModelException("Expected an 'InferenceResponse' object in the execute "
                                                     f"function return list, found type '{type(response)}'.")
            if wanted[index]:
                response._prune(wanted[index])
            responses.append(self._from_response(batch, index, response, True, room))
        return responses

    def _executed(self, batch: int, responses: list[p.Response] | BaseException, error: BaseException | None,
                  times: list[int]) -> None:
        if isinstance(responses, BaseException):
            error, responses = responses, []
        text = None if error is None else codes.describe(error)
        now = time.monotonic_ns()
        if len(times) < 3:
            times.append(now)  # execute raised, or a decoupled coroutine runs on: it returned now
        times.append(now)
        message = p.Executed(batch, responses, text, p.flat_frees(self.frees.take()), times)
        with self._outbox_lock:
            self._outbox.append(message)
            if not self.channel.has_frame():  # else more work is already here: answer it all in one write
                self._send_outbox()

    def _flush(self) -> None:
        with self._outbox_lock:
            self._send_outbox()

    def _send_outbox(self) -> None:
        """Under the outbox lock: write the answers held (the lock keeps them in order)."""
        messages, self._outbox = self._outbox, []
        if messages:
            self.metrics.send(messages)

    def _async_failed(self, batch: int, count: int, done: Future[Any]) -> None:
        """A decoupled `async def execute` that raised: its open requests fail like a raising
        plain `execute` would fail them."""
        error = done.exception()
        if error is None:
            return
        message = codes.describe(error)  # the server ignores it for requests already answered
        self.channel.send(p.Sent([p.Response(batch, i, [], message, "INTERNAL") for i in range(count)]))

    # -- requests and responses across the boundary ------------------------------------------

    def _to_request(self, batch: int, index: int, request: p.Request) -> Any:
        inputs = [Tensor._of(ref.name, self._array(ref), codes.TYPE_CODES[ref.datatype]) for ref in request.inputs]
        return pb_utils.InferenceRequest._received(
            inputs=inputs, request_id=request.id, correlation_id=request.correlation_id, flags=request.flags,
            timeout=request.timeout, parameters=request.parameters, requested_output_names=request.outputs,
            model_name=self.model_name, model_version=self.model_version, handle=_Handle(batch, index),
            decoupled=self.decoupled, trace=codes.trace(request.trace))

    def _array(self, ref: p.TensorRef) -> np.ndarray:
        return p.tensor_array(self.segments, ref, codes.NUMPY_TYPES[ref.datatype])

    def _write(self, tensor: Tensor, room: p.InlineRoom) -> p.TensorRef:
        """A tensor for the server; its datatype is the one its Tensor() found."""
        return p.tensor_ref(self.arena, tensor.name(), codes.TYPE_NAMES[tensor.triton_dtype()], tensor.as_numpy(), room)

    def _from_response(self, batch: int, index: int, response: Any, final: bool,
                       room: p.InlineRoom) -> p.Response:
        if response is None:
            return p.Response(batch, index, [], final=final)
        if response.has_error():
            error = response.error()
            return p.Response(batch, index, [], error.message(), codes.STATUS_BY_CODE.get(error.code(), "INTERNAL"),
                              final=final)
        outputs = [self._write(tensor, room) for tensor in response.output_tensors()]
        parameters = response.parameters()
        return p.Response(batch, index, outputs, parameters=parameters or "{}", final=final)

    def _to_response(self, response: p.Response) -> Any:
        if response.error is not None:
            code = codes.CODE_BY_STATUS.get(response.code, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error, code))
        outputs = [pb_utils.Tensor(ref.name, self._array(ref)) for ref in response.outputs]
        return pb_utils.InferenceResponse(output_tensors=outputs, parameters=json.loads(response.parameters))

    # -- pb_utils runtime --------------------------------------------------------------------

    model_name = ""
    model_version = 0

    def send(self, handle: object, response: Any, flags: int) -> None:
        assert isinstance(handle, _Handle)
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        message = self._from_response(handle.batch, handle.index, response, final, p.InlineRoom())
        self.metrics.send([p.Sent([message], p.flat_frees(self.frees.take()))])

    def is_cancelled(self, handle: object) -> bool:
        assert isinstance(handle, _Handle)
        answer = self._query("is_cancelled", [handle.batch, handle.index])
        return bool(answer)

    def _bls_call(self, request: Any, decoupled: bool) -> tuple[int, p.BlsCall]:
        call = next(self._call_ids)
        room = p.InlineRoom()  # one BlsCall message
        inputs = [self._write(tensor, room) for tensor in request.inputs()]
        parameters = request.parameters()
        message = p.BlsCall(
            call, request.model_name(), int(request.model_version()),
            p.Request(request.request_id(), request.correlation_id(), request.flags(), request.timeout(),
                      parameters if isinstance(parameters, str) else json.dumps(parameters),
                      list(request.requested_output_names()), inputs, codes.trace_id(request.trace())),
            decoupled, p.flat_frees(self.frees.take()))
        return call, message

    def exec(self, request: Any, decoupled: bool) -> Any:
        if self.down:
            raise pb_utils.TritonModelException("the server closed the connection")
        call, message = self._bls_call(request, decoupled)
        if decoupled:
            responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self._calls[call] = responses
            self._expect_answer()
            self.channel.send(message)
            return _BlsStream(self, call, responses)
        future: Future[Any] = Future()
        self._calls[call] = future
        self._expect_answer()
        self.channel.send(message)
        return future.result()

    async def async_exec(self, request: Any, decoupled: bool) -> Any:
        if decoupled:  # the iterator blocks on each next(); hand it over once the call is sent
            return self.exec(request, True)
        call, message = self._bls_call(request, False)
        future: Future[Any] = Future()
        self._calls[call] = future
        self._expect_answer()
        self.channel.send(message)
        return await asyncio.wrap_future(future)

    def forget_call(self, call: int) -> None:
        self._calls.pop(call, None)

    def log(self, level: int, message: str, filename: str, line: int) -> None:
        try:
            self.channel.send(p.Log(int(level), str(message), filename, line))
        except p.ChannelClosed:
            print(message, file=sys.stderr)

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._query("load_model", [model_name, config or "", dict(files or {})])

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._query("unload_model", [model_name, bool(unload_dependents)])

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        return bool(self._query("is_model_ready", [model_name, str(model_version or "")]))

    def _query(self, op: str, args: list[Any]) -> Any:
        call = next(self._call_ids)
        future: Future[p.Answer] = Future()
        self._queries[call] = future
        self._expect_answer()
        self.channel.send(p.Query(call, op, args))
        answer = future.result()
        if answer.error is not None:
            raise pb_utils.TritonModelException(answer.error)
        return answer.value

    # -- custom metrics ----------------------------------------------------------------------

    def metrics_changed(self) -> None:
        self.metrics.changed()

    def metric_value(self, series: int) -> float | None:
        """The server's value of a series (every process sharing it counts), after the changes
        waiting; None while the server's answers are not read (initialize, finalize)."""
        if not self.serving or self.down:
            return None
        call = next(self._call_ids)
        future: Future[p.Answer] = Future()
        self._queries[call] = future
        self._expect_answer()
        try:
            self.metrics.send([p.MetricValue(call, series)])
        except p.ChannelClosed:
            self._queries.pop(call, None)
            return None
        answer = future.result()
        if answer.error is not None:
            raise pb_utils.TritonModelException(answer.error)
        return float(answer.value)

    # -- shared memory -----------------------------------------------------------------------

    def _announce(self, segment: int, fd: int, size: int) -> None:
        self.channel.send(p.Segment(segment, size), fds=(fd,))


def _auto_complete(stub: Stub, message: p.AutoComplete) -> p.AutoCompleted:
    cls = stub.load(message.model_file)
    method = getattr(cls, "auto_complete_config", None)
    if method is None:
        return p.AutoCompleted(None)
    config = pb_utils.ModelConfig(json.loads(message.config))
    completed = method(config)
    if completed is None:
        completed = config
    return p.AutoCompleted(json.dumps(completed.as_dict()))


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    channel = p.Channel(sock)
    stub = Stub(channel)
    sys.modules["triton_python_backend_utils"] = pb_utils
    first = channel.recv()
    if isinstance(first, p.AutoComplete):
        try:
            reply = _auto_complete(stub, first)
        except BaseException as error:
            reply = p.AutoCompleted(error=_failure(error))
        channel.send(reply)
        return 0
    if not isinstance(first, p.Init):
        return 2
    stub.model_name = first.args.get("model_name", "")
    stub.model_version = int(first.args.get("model_version", "0") or 0)
    pb_utils._set_runtime(stub)
    try:
        stub.initialize(first)
    except BaseException as error:
        channel.send(p.Ready(_failure(error)))
        return 1
    # the metrics initialize created go first: the server has them before the model is ready
    stub.metrics.send([p.Ready(probes_ready=callable(getattr(stub.model, "is_ready", None)))])
    stub.serve()
    if hasattr(stub.model, "finalize"):
        try:
            stub.model.finalize()
        except BaseException:
            traceback.print_exc()
    return 0


def _failure(error: BaseException) -> str:
    """An initialize / auto-complete failure as the model index shows it: the exception's message,
    then the traceback for whoever reads the log."""
    lines = traceback.format_exception(error)
    return f"{codes.describe(error)}\n{''.join(lines)}"


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads (reader, model threads) must not keep the process
