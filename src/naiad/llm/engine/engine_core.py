"""The engine core in its own process: `LLMEngine` stepping in a busy loop, msgspec messages on a socket.

Why a process: the server's event loop, HTTP parsing, detokenization and response encoding
hold the GIL; in the same process they stall the step that every running sequence waits
for. In its own process the core only reads requests between steps and writes one message
per step with every sequence's new tokens (as vLLM v1's EngineCore).

The loop: when nothing is running it sleeps in `poll` until a message comes; otherwise it
drains the messages that are waiting (adds, aborts), runs one step and sends its outputs,
without sleeping. A request whose grammar (structured outputs) is new waits for it on a thread
of its own: a large JSON schema compiles for seconds, which on the loop would stall every stream
(see `_add`). `EngineClient` is the server's end: it starts the core (in a process, or in
a thread for tests and debugging), sends requests and aborts, and hands every message the core
sends to a callback: on the server's event loop when it is given one to watch the socket with,
else on a reader thread of its own. The socket is the server's `naiad.channel`, as a Python
model's is: with the loop reading, sends never wait for a core that is in a step and not reading
(a long prompt is larger than the socket holds); what it cannot take yet, the loop sends when
there is room. If the core process dies, the callback gets
`EngineFailed` for every request still open, the client stops accepting work, and `on_exit`
is told why (the llm backend's supervisor then starts a fresh core: `naiad.backends.llm_supervisor`).

With tensor parallelism the core is rank 0 and starts the workers itself (`naiad.llm.distributed.workers`).
A step that fails because a worker died fails the open requests, as any failed step does, and
then the core exits: the group cannot run without that rank. An idle core checks its workers
every `WORKER_CHECK_SECS` and exits the same way, so that a worker lost while nothing runs is
replaced before the next request rather than failing it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgspec

from naiad.channel import Channel, ChannelClosed, Watch
from naiad.llm.distributed.workers import WorkerDied
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.engine.sequence import Sequence, TokenLogprobs

log = logging.getLogger(__name__)

#: how often an idle core with tensor-parallel workers checks that they are alive
WORKER_CHECK_SECS = 1.0
#: how often a core with nothing to step but grammars compiling looks whether one is done
COMPILE_POLL_SECS = 0.002

# ------------------------------------------------------------------------------ client → core


class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling_params: SamplingParams
    ignore_eos: bool = False
    priority: int = 0


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


ClientMessage = AddRequest | AbortRequests | Shutdown

# ------------------------------------------------------------------------------ core → client


class EngineInfo(msgspec.Struct, tag="ready"):
    """The first message of a core that started: what request validation needs."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    kv_cache_bytes: int = 0  # the KV cache over every rank (what a memory budget must count)


class RequestOutput(msgspec.Struct, array_like=True):
    """A request's tokens since its last output; `finish_reason` set on its last one."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    #: on a "stop" finish: whether the last token is an end-of-sequence or stop token (it has no
    #: text), not the end of a structured output's grammar (it has)
    on_stop_token: bool = False
    #: time.monotonic() (one clock for every process of the machine) when the request first
    #: joined the batch: its queueing ends there
    scheduled_at: float = 0.0
    #: with prompt_logprobs, on the request's first output: one entry per prompt token (None first)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    #: an embedding request's vector, on its (only) output
    embedding: list[float] | None = None


class EngineStats(msgspec.Struct, array_like=True):
    """The engine's state after a step, for the server's metrics (a few ints per step)."""

    num_used_blocks: int
    num_blocks: int
    num_preemptions: int  # since the engine started
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache, since the start
    prefix_cache_hits: int  # of which were found


class StepOutputs(msgspec.Struct, tag="step"):
    outputs: list[RequestOutput]
    stats: EngineStats | None = None


class RequestRejected(msgspec.Struct, tag="rejected"):
    """The engine refused a request (a token outside the vocabulary, a duplicate id...)."""

    request_id: str
    message: str


class EngineFailed(msgspec.Struct, tag="failed"):
    """A step failed (its requests are aborted), the core could not start, or it died."""

    message: str
    request_ids: list[str]


CoreMessage = EngineInfo | StepOutputs | RequestRejected | EngineFailed

_client_decoder: msgspec.msgpack.Decoder[ClientMessage] = msgspec.msgpack.Decoder(ClientMessage)
_core_decoder: msgspec.msgpack.Decoder[CoreMessage] = msgspec.msgpack.Decoder(CoreMessage)


# --------------------------------------------------------------------------------- the core


def run_core(config: EngineConfig, sock: socket.socket) -> None:
    """The core's entry point (a process's target, or a thread's): build the engine, then loop."""
    engine = None
    channel = Channel(sock, _client_decoder)  # blocking: the core waits for the server as it must
    try:
        try:
            engine = LLMEngine(config)
        except Exception as error:  # reported to the client, which fails the model's load
            log.exception("the LLM engine could not start")
            channel.send(EngineFailed(f"the engine could not start: {error}", []))
            return
        runner = engine.runner
        channel.send(EngineInfo(engine.max_model_len, runner.args.vocab_size, runner.num_blocks,
                                runner.kv_cache_bytes()))
        EngineCore(engine, channel).run()
    except ChannelClosed:
        pass  # the client went away: nothing left to serve
    finally:
        if engine is not None:
            engine.close()  # the tensor-parallel workers, if any
        channel.close()  # in a thread, this is what ends the client's reader


class EngineCore:
    """The busy loop around one engine; see the module's docstring."""

    def __init__(self, engine: LLMEngine, channel: Channel[ClientMessage]) -> None:
        self.engine = engine
        self.channel = channel
        self._active: dict[str, Sequence] = {}
        self._sent: dict[str, int] = {}  # output tokens already sent, by request id
        self._broken = False  # a tensor-parallel worker died: no step can run again
        self._compiler: ThreadPoolExecutor | None = None  # started by the first new grammar
        self._compiles: dict[tuple[str, str], Future[Any]] = {}  # by guide: one compile per guide
        self._waiting: dict[str, AddRequest] = {}  # requests whose grammar is compiling

    def run(self) -> None:
        try:
            while not self._broken:
                if not self._active and not self._waiting and not self._wait_for_work():
                    return
                if not self._active and self._waiting:
                    self.channel.poll(COMPILE_POLL_SECS)  # nothing to step: a message or a grammar
                while self.channel.poll(0):
                    if not self._handle(self.channel.recv()):
                        return
                if self._compiles:
                    self._add_compiled()
                if self._active:
                    self.channel.send(self._step())
        finally:
            if self._compiler is not None:
                self._compiler.shutdown(wait=False, cancel_futures=True)

    def _wait_for_work(self) -> bool:
        """Idle: sleep until the client writes. With workers, wake up now and then to check that
        they live; False (after telling the client why) when one died."""
        workers = self.engine.workers
        if workers is None:
            self.channel.poll(None)
            return True
        while not self.channel.poll(WORKER_CHECK_SECS):
            try:
                workers.check()
            except WorkerDied as error:
                log.error("the LLM engine core stops: %s", error)
                self.channel.send(EngineFailed(f"the engine failed: {error}", []))
                return False
        return True

    def _handle(self, message: ClientMessage) -> bool:
        if isinstance(message, AddRequest):
            self._add(message)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                if self._waiting.pop(request_id, None) is not None:
                    continue  # its grammar compiles on (kept for the next request that asks)
                if self._active.pop(request_id, None) is not None:
                    self.engine.abort_request(request_id)
                    del self._sent[request_id]
        else:
            return False
        return True

    def _add(self, request: AddRequest) -> None:
        guide = request.sampling_params.guide
        if guide is not None and not self.engine.grammars.is_compiled(guide):
            # A new grammar compiles on a thread (llguidance lets go of the GIL) while the other
            # streams step on; the request joins once it is done (`_add_compiled`).
            if guide not in self._compiles:
                if self._compiler is None:
                    self._compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
                self._compiles[guide] = self._compiler.submit(self.engine.grammars.compile, guide)
            self._waiting[request.request_id] = request
            return
        self._add_now(request)

    def _add_compiled(self) -> None:
        """Add the waiting requests whose grammar is compiled; reject those whose grammar failed."""
        done = {guide: future for guide, future in self._compiles.items() if future.done()}
        if not done:
            return
        for guide in done:
            del self._compiles[guide]
        for request_id, request in list(self._waiting.items()):
            future = done.get(request.sampling_params.guide)  # type: ignore[arg-type]
            if future is None:
                continue
            del self._waiting[request_id]
            error = future.exception()
            if error is not None:  # not compiled again on the loop: it could be as slow to fail
                self.channel.send(RequestRejected(request_id, str(error)))
            else:
                self._add_now(request)  # the compiled grammar is in the engine's cache now

    def _add_now(self, request: AddRequest) -> None:
        try:
            self.engine.add_request(
                request.prompt_token_ids, request.max_tokens, sampling_params=request.sampling_params,
                request_id=request.request_id, ignore_eos=request.ignore_eos, priority=request.priority,
            )
        except Exception as error:
            self.channel.send(RequestRejected(request.request_id, str(error)))
            return
        seq = self.engine.scheduler.get(request.request_id)
        assert seq is not None
        self._active[request.request_id] = seq
        self._sent[request.request_id] = 0

    def _step(self) -> StepOutputs | EngineFailed:
        try:
            self.engine.step()
        except Exception as error:  # its requests cannot go on; the engine can serve new ones
            log.exception("an LLM engine step failed")
            failed = list(self._active)
            for request_id in failed:
                self.engine.abort_request(request_id)
            self._active.clear()
            self._sent.clear()
            self._broken = isinstance(error, WorkerDied)
            return EngineFailed(f"the engine failed: {error}", failed)
        outputs = []
        for request_id, seq in list(self._active.items()):
            sent, total = self._sent[request_id], seq.num_output_tokens
            if total == sent and not seq.is_finished:
                continue  # a prefill chunk with more to come, or preempted
            logprobs = None if seq.logprobs is None else seq.logprobs[sent:]
            reason = str(seq.finish_reason) if seq.is_finished and seq.finish_reason is not None else None
            outputs.append(RequestOutput(request_id, seq.output_token_ids[sent:], logprobs, reason,
                                         seq.num_prompt_tokens, seq.num_cached_tokens,
                                         seq.is_finished and seq.ends_with_stop_token, seq.first_scheduled,
                                         seq.prompt_logprobs if not sent else None, seq.embedding))
            self._sent[request_id] = total
            if seq.is_finished:
                del self._active[request_id], self._sent[request_id]
        engine, blocks = self.engine, self.engine.block_manager
        stats = EngineStats(blocks.num_used_blocks, engine.runner.num_blocks, engine.scheduler.num_preemptions,
                            blocks.prefix_cache_queries, blocks.prefix_cache_hits)
        return StepOutputs(outputs, stats)


# ------------------------------------------------------------------------------- the client


class EngineClient:
    """The server's end of one engine core.

    `on_message` runs for every `StepOutputs`, `RequestRejected` and `EngineFailed`: on the
    server's event loop when `watch` is given and the server runs one (the loop reads the socket
    itself, so a step's tokens reach the streams without waking a thread that then wakes the
    loop), else on the client's reader thread. It must not block for long, as the core's next
    outputs wait behind it. With the loop reading, `add` and `abort` never wait for the core to
    read (`watch_writable` tells the loop when the socket has room for the rest); without one
    they may wait for the core's step to end. `on_exit(cause)` runs last, on a thread of its own,
    when the core ended without `close()`. `in_process` runs the core on a thread of this
    process instead (same loop, same socket).
    """

    def __init__(
        self, config: EngineConfig, on_message: Callable[[CoreMessage], None], *, in_process: bool = False,
        name: str = "llm", on_exit: Callable[[str], None] | None = None, watch: Watch | None = None,
        watch_writable: Watch | None = None,
    ) -> None:
        self._on_message = on_message
        self._on_exit = on_exit
        self._last_failure = ""  # the core's latest EngineFailed not followed by a good step
        ours, core_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._channel = Channel(ours, _core_decoder)
        self._open: set[str] = set()  # request ids sent and not yet finished, rejected or aborted
        self._open_lock = threading.Lock()
        self.alive = True
        if in_process:
            self._core: threading.Thread | multiprocessing.process.BaseProcess = threading.Thread(
                target=run_core, args=(config, core_end), name=f"{name}-core", daemon=True)
        else:
            # spawn, not fork: the server has threads (and maybe CUDA) that a fork would copy broken.
            self._core = multiprocessing.get_context("spawn").Process(
                target=run_core, args=(config, core_end), name=f"{name}-core", daemon=True)
        self._core.start()
        if not in_process:
            core_end.close()  # the child has its own copy; ours would keep the socket open after it dies
        first = self._receive()
        if not isinstance(first, EngineInfo):
            self.close()
            message = first.message if isinstance(first, EngineFailed) else "the engine core did not start"
            raise RuntimeError(message)
        self.info = first
        self.pid = self._core.pid if isinstance(self._core, multiprocessing.process.BaseProcess) else None
        self._name = name
        self._reader: threading.Thread | None = None
        self._unwatch: Callable[[], None] | None = None
        if watch is not None:
            self._channel.set_nonblocking()
            self._unwatch = watch(ours.fileno(), self._readable)
            if self._unwatch is None:
                ours.setblocking(True)  # no loop after all: read on a thread
            elif watch_writable is not None:
                self._channel.never_wait(watch_writable)
        if self._unwatch is None:
            self._reader = threading.Thread(target=self._read, name=f"{name}-outputs", daemon=True)
            self._reader.start()
        # (Nothing came with the first message for the loop to miss: a core sends nothing more
        # before its first request.)

    def _receive(self) -> CoreMessage | None:
        try:
            return self._channel.recv()
        except ChannelClosed:
            return None

    def add(self, request: AddRequest) -> None:
        with self._open_lock:
            if not self.alive:
                raise RuntimeError("the engine core is not running")
            self._open.add(request.request_id)
        self._send(request)

    def abort(self, request_ids: list[str]) -> None:
        with self._open_lock:
            self._open.difference_update(request_ids)
        self._send(AbortRequests(request_ids))

    def _send(self, message: ClientMessage) -> None:
        with contextlib.suppress(ChannelClosed):  # the core is gone: the reader reports it, fails what was open
            self._channel.send(message)

    def _read(self) -> None:
        """The reader thread (no event loop to watch the socket): every message, then the end."""
        while True:
            message = self._receive()
            if message is None:
                break
            self._handle(message)
        if self._ended():
            self._report_exit()

    def _readable(self) -> None:
        """On the event loop, whenever the socket is readable: the whole messages that are here."""
        try:
            messages = self._channel.recv_ready()
        except ChannelClosed:  # the core's end closed: it exited, or close() stopped it
            if self._unwatch is not None:
                self._unwatch()  # on the loop: at once, before anything may close the descriptor
            if self._ended():  # the wait for the process and the callbacks go to a thread
                threading.Thread(target=self._report_exit, name=f"{self._name}-exit", daemon=True).start()
            return
        for message in messages:
            try:
                self._handle(message)
            except Exception:  # one bad callback must not stop the others
                log.exception("the output of the LLM engine core '%s' could not be handled", self._name)

    def _handle(self, message: CoreMessage) -> None:
        self._forget_closed(message)
        if isinstance(message, EngineFailed):
            self._last_failure = message.message
        elif isinstance(message, StepOutputs):
            self._last_failure = ""  # that failure did not stop the core
        self._on_message(message)

    def _ended(self) -> bool:
        """The socket reached its end: stop taking work; whether the core ended on its own (then
        `_report_exit` tells why) rather than by close()."""
        with self._open_lock:
            was_alive, self.alive = self.alive, False
        return was_alive

    def _report_exit(self) -> None:
        """The core ended on its own: say why, and fail the requests that were open (off the loop:
        it waits for the process)."""
        with self._open_lock:
            orphans, self._open = sorted(self._open), set()
        exited = self._exit_description()
        log.error("the LLM engine core %s; %d request(s) fail", exited, len(orphans))
        if self._on_exit is not None:  # first: whoever hears of the failure finds the restart under way
            self._on_exit(f"the engine {exited}" + (f" ({self._last_failure})" if self._last_failure else ""))
        self._on_message(EngineFailed(f"the engine {exited}", orphans))

    def _exit_description(self) -> str:
        """'process exited with code -9' (the signal, negated), or 'thread ended'."""
        if not isinstance(self._core, multiprocessing.process.BaseProcess):
            return "thread ended"
        self._core.join(5)  # the socket closes just before the process is reaped
        code = self._core.exitcode
        return "process exited" if code is None else f"process exited with code {code}"

    def _forget_closed(self, message: CoreMessage) -> None:
        with self._open_lock:
            if isinstance(message, StepOutputs):
                self._open.difference_update(o.request_id for o in message.outputs if o.finish_reason is not None)
            elif isinstance(message, RequestRejected):
                self._open.discard(message.request_id)
            elif isinstance(message, EngineFailed):
                self._open.difference_update(message.request_ids)

    def is_alive(self) -> bool:
        return self.alive and self._core.is_alive()

    def close(self, timeout: float = 30) -> None:
        """Stop the core (its open requests are dropped) and wait for it."""
        with self._open_lock:
            self.alive = False
            self._open.clear()
        self._send(Shutdown())
        self._core.join(timeout)
        if isinstance(self._core, multiprocessing.process.BaseProcess) and self._core.is_alive():
            self._core.kill()
            self._core.join(5)
        # The reader sees the end now that the core's end is closed. Wait for it (or for the loop
        # to stop watching) before closing ours: a reader still in recv on a closed descriptor
        # would read whatever socket reuses the number.
        unwatch = getattr(self, "_unwatch", None)  # none when the core failed to start
        if unwatch is not None:
            unwatch()
        reader = getattr(self, "_reader", None)
        if reader is not None and reader is not threading.current_thread():
            reader.join(5)
        self._channel.close()
