"""Messages between the server and a Python model's process, and the socket they travel on.

Control messages are msgspec msgpack structs, length-prefixed on a Unix stream socket; tensor
payloads over `INLINE_MAX` bytes never travel here, only where they lie in shared memory
(`TensorRef`). New shared-memory segments travel as file descriptors attached to their `Segment`
message. Messages carry the locations the sender has finished reading (`frees`, flat [segment,
offset, ...]) so the other side can reuse them without a message of their own.

Imports only the standard library, numpy and msgspec: it runs inside model processes too.
"""

from __future__ import annotations

import array
import collections
import contextlib
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

if TYPE_CHECKING:
    from naiad.backends.python.shm import Arena, SegmentMap

_LENGTH = struct.Struct("<I")
_READ_SIZE = 1 << 18
_ANCILLARY = socket.CMSG_SPACE(16 * 4)  # room for the descriptors of a few segments


#: Tensors of up to this many bytes travel inside their message (`TensorRef.data`), not through
#: the arena: for a small tensor the arena's allocation, the reader's view and its finalizer, and
#: the location sent back to be freed cost more than copying the bytes twice.
INLINE_MAX = 16 * 1024
#: ... and at most this many bytes of them per message, the rest through the arena: the server's
#: event loop writes `Execute` messages while the model process executes the batch before (two
#: in flight), so two messages must fit the socket's buffer (208 KiB by default on Linux) or the
#: loop would wait for the model to finish before it could serve anyone else.
MESSAGE_INLINE_MAX = 64 * 1024
INLINE = -2  # the `segment` of a tensor carried in its message


class InlineRoom:
    """What one message may still carry inline (`MESSAGE_INLINE_MAX` to begin with)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MESSAGE_INLINE_MAX


class TensorRef(msgspec.Struct, array_like=True):
    """A tensor in the sender's arena, or (segment INLINE) in `data`. BYTES tensors are in
    Triton's serialized form (4-byte little-endian length before each element)."""

    name: str
    datatype: str  # V2 name: FP32, BYTES, ...
    shape: list[int]
    segment: int
    offset: int
    nbytes: int
    data: bytearray = msgspec.field(default_factory=bytearray)  # a bytearray: the reader's array is writable


class Request(msgspec.Struct, array_like=True):
    id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters: str  # JSON object, as pb_utils hands it to the model
    outputs: list[str]
    inputs: list[TensorRef]
    trace: int = 0  # the server-side trace id of a traced request (BLS children join it), else 0


class Response(msgspec.Struct, array_like=True):
    """One response to request `index` of batch `batch` (or of BLS call `batch`)."""

    batch: int
    index: int
    outputs: list[TensorRef]
    error: str | None = None
    code: str = "INTERNAL"  # naiad Status name of the error
    parameters: str = "{}"
    final: bool = True


# -- server -> model process -----------------------------------------------------------------


class Init(msgspec.Struct, tag=True, array_like=True):
    model_file: str
    args: dict[str, str]
    decoupled: bool


class AutoComplete(msgspec.Struct, tag=True, array_like=True):
    model_file: str
    config: str  # JSON


class Execute(msgspec.Struct, tag=True, array_like=True):
    batch: int
    requests: list[Request]
    frees: list[int] = []


class BlsReply(msgspec.Struct, tag=True, array_like=True):
    call: int
    response: Response
    frees: list[int] = []


class Answer(msgspec.Struct, tag=True, array_like=True):
    """The reply to a `Query` (is_cancelled and model control from the model, is_ready from the
    server): a value or an error."""

    call: int
    value: Any = None
    error: str | None = None


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    pass


# -- model process -> server -----------------------------------------------------------------


class Ready(msgspec.Struct, tag=True, array_like=True):
    error: str | None = None
    probes_ready: bool = False  # the model defines is_ready(): the server asks it (a Query "is_ready")


class AutoCompleted(msgspec.Struct, tag=True, array_like=True):
    config: str | None = None  # JSON, or None when the model has no auto_complete_config
    error: str | None = None


class Executed(msgspec.Struct, tag=True, array_like=True):
    """`execute` returned for `batch`: the responses it returned (and any sent before), or the
    exception it raised, which fails every request of the batch still open. `times` are the
    execution's phases (time.monotonic_ns(), one clock for every process): started, requests
    ready for the model, execute returned, outputs written."""

    batch: int
    responses: list[Response]
    error: str | None = None
    frees: list[int] = []
    times: list[int] = []


class Sent(msgspec.Struct, tag=True, array_like=True):
    """Responses sent through response senders (decoupled models, possibly from other threads)."""

    responses: list[Response]
    frees: list[int] = []


class BlsCall(msgspec.Struct, tag=True, array_like=True):
    call: int
    model_name: str
    model_version: int
    request: Request
    decoupled: bool
    frees: list[int] = []


class BlsCancel(msgspec.Struct, tag=True, array_like=True):
    call: int


class Query(msgspec.Struct, tag=True, array_like=True):
    """is_cancelled(batch, index), load_model, unload_model, is_model_ready: answered by `Answer`."""

    call: int
    op: str
    args: list[Any]


class Log(msgspec.Struct, tag=True, array_like=True):
    level: int
    message: str
    filename: str
    line: int


# -- both ways -------------------------------------------------------------------------------


class Segment(msgspec.Struct, tag=True, array_like=True):
    """A new segment of the sender's arena; its memfd is attached to this message."""

    segment: int
    size: int


class Frees(msgspec.Struct, tag=True, array_like=True):
    frees: list[int]


Message = (Init | AutoComplete | Execute | BlsReply | Answer | Shutdown | Ready | AutoCompleted | Executed
           | Sent | BlsCall | BlsCancel | Query | Log | Segment | Frees)


class ChannelClosed(Exception):
    """The other side closed the socket or died."""


class Channel:
    """Length-prefixed msgpack messages on a Unix stream socket; `send` is thread-safe, `recv`
    belongs to one reader thread. File descriptors ride on `send(..., fds=...)`.

    A channel read by an event loop (`wait_when_full(False)`) never waits to send: what the
    socket cannot take now stays in a backlog, in order, and `on_backlog` is called once the
    backlog starts so that the loop sends the rest (`send_backlog`) when the socket has room.
    The loop is the only reader of the model's answers: were it to wait for the model to read
    while the model waits for it to read an answer, the whole server would stop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._out = bytearray()  # reused for every frame (under the send lock)
        self._wait_when_full = True
        self._backlog: collections.deque[tuple[bytes, tuple[int, ...]]] = collections.deque()
        self.on_backlog: Callable[[], None] | None = None  # called when a backlog starts
        # Incoming bytes land in one reused buffer between _start and _end: no allocation per read.
        self._in = bytearray(_READ_SIZE)
        self._view = memoryview(self._in)  # (kept: one view per buffer, not one per read; _fill replaces both)
        self._start = 0
        self._end = 0
        self._fds: collections.deque[int] = collections.deque()
        self._closed = False  # end of stream seen while messages were still to be handed out
        # A blocking reader waits for input here, not inside recvmsg: see `_wait_readable`.
        self._input = select.poll()
        self._input.register(sock, select.POLLIN)

    def send(self, message: Message, fds: tuple[int, ...] = ()) -> None:
        self.send_many((message,), fds)

    def send_many(self, messages: tuple[Message, ...] | list[Message], fds: tuple[int, ...] = ()) -> None:
        """Write the messages in one go (one system call for all of them)."""
        started = False
        with self._send_lock:
            out = self._out
            out.clear()
            for message in messages:
                start = len(out)
                self._encoder.encode_into(message, out, start + 4)
                _LENGTH.pack_into(out, start, len(out) - start - 4)
            if not self._wait_when_full:
                if self._backlog:  # behind what waits already
                    self._backlog.append((bytes(out), _own(fds)))
                    return
                sent = self._send_some(out, fds)
                if sent == len(out):
                    return
                self._backlog.append((bytes(out[sent:]), _own(fds) if sent == 0 else ()))
                started = True
            else:
                try:
                    if fds:
                        sent = self._retry(self.sock.sendmsg, [out], _carrying(fds))
                    else:
                        try:
                            sent = self.sock.send(out)  # most writes: all of it at once
                        except BlockingIOError:
                            sent = 0
                    if sent < len(out):
                        with memoryview(out) as view:
                            while sent < len(out):
                                sent += self._retry(self.sock.send, view[sent:])
                except OSError as error:
                    raise ChannelClosed(str(error)) from error
        if started and self.on_backlog is not None:  # outside the lock: it may wait for the loop
            self.on_backlog()

    def wait_when_full(self, wait: bool) -> None:
        """False for a non-blocking socket read by an event loop: sends never wait (see the class)."""
        self._wait_when_full = wait

    def send_backlog(self) -> bool:
        """Send what the backlog holds, as far as the socket takes it now; True once it is empty."""
        with self._send_lock:
            while self._backlog:
                data, fds = self._backlog[0]
                sent = self._send_some(data, fds)
                if sent and fds:
                    _close_all(fds)  # they went with the first byte
                if sent < len(data):
                    self._backlog[0] = (data[sent:], fds if sent == 0 else ())
                    return False
                self._backlog.popleft()
            return True

    def _send_some(self, data: bytes | bytearray, fds: tuple[int, ...]) -> int:
        """One write that takes what the (non-blocking) socket has room for; descriptors go with
        its first byte."""
        try:
            if fds:
                return self.sock.sendmsg([data], _carrying(fds))
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as error:
            raise ChannelClosed(str(error)) from error

    def _retry(self, write: Callable[..., int], *args: Any) -> int:
        """One write; on a non-blocking socket with a full buffer, wait until it can take more."""
        while True:
            try:
                return write(*args)
            except BlockingIOError:
                select.select([], [self.sock], [])

    def has_frame(self) -> bool:
        """Whether a whole message already waits in the buffer (recv would not block)."""
        available = self._end - self._start
        return available >= 4 and available >= 4 + _LENGTH.unpack_from(self._in, self._start)[0]

    def recv(self) -> Message:
        """The next message; raises ChannelClosed at end of stream."""
        while True:
            available = self._end - self._start
            need = 4
            if available >= 4:
                (length,) = _LENGTH.unpack_from(self._in, self._start)
                need += length
                if available >= need:
                    begin = self._start + 4
                    message = self._decoder.decode(self._view[begin : begin + length])
                    self._start = begin + length
                    if self._start == self._end:
                        self._start = self._end = 0
                    return message
            if self.sock.gettimeout() is None:  # blocking (with a timeout, the socket polls itself)
                self._wait_readable()
            self._fill(need)

    def _wait_readable(self) -> None:
        """Sleep until the socket has bytes to read, or its end of stream.

        A thread blocked in recvmsg on a Unix stream socket sleeps on the socket's only wait
        queue, which also gets the "room to write again" wake-up that the *other* side causes
        each time it reads what this side wrote. A model process answers, goes back to reading,
        and was woken once more for nothing when the server read the answer: a second context
        switch per request (and the server paid for waking it). A wait in poll for POLLIN is
        only woken by input: the kernel filters a poller's wake-ups by the events it asked for."""
        if self.sock.fileno() < 0:  # closed: the poller's number may belong to another file now
            raise ChannelClosed("the channel is closed")
        self._input.poll()

    def set_nonblocking(self) -> None:
        """For an event loop that reads with `recv_ready` when the socket is readable."""
        self.sock.setblocking(False)

    def recv_ready(self) -> list[Message]:
        """The whole messages that are here now (non-blocking socket), for an event loop that
        calls again while the socket stays readable (asyncio's readers are level-triggered);
        raises ChannelClosed at end of stream, after the messages before it were returned."""
        messages: list[Message] = []
        drained = False
        while True:
            while self.has_frame():
                messages.append(self.recv())
            if drained:
                # The last read took less than it was offered: the socket was empty, and reading
                # again would only fail (EAGAIN). Bytes that arrive later wake the loop again.
                return messages
            try:
                drained = self._fill(4)
            except BlockingIOError:
                return messages
            except ChannelClosed:
                if messages:
                    self._closed = True
                    return messages
                raise

    def take_fd(self) -> int:
        """The descriptor that came with the `Segment` message just received."""
        return self._fds.popleft()

    def _fill(self, need: int) -> bool:
        """Read more bytes, first making room for a frame of `need` bytes from `_start`; True
        when the read took less than the room it was offered (the socket had no more)."""
        if len(self._in) - self._start < max(need, _READ_SIZE // 4):
            pending = self._in[self._start : self._end]
            size = max(_READ_SIZE, 2 * need)
            if size != len(self._in) or self._start:
                grown = bytearray(size)
                grown[: len(pending)] = pending
                self._in, self._view = grown, memoryview(grown)
            self._start, self._end = 0, len(pending)
        if self._closed:
            raise ChannelClosed("the other side closed the connection")
        room = len(self._in) - self._end
        try:
            count, ancillary, _, _ = self.sock.recvmsg_into([self._view[self._end :]], _ANCILLARY)
        except BlockingIOError:
            raise
        except OSError as error:
            raise ChannelClosed(str(error)) from error
        if not count:
            raise ChannelClosed("the other side closed the connection")
        self._end += count
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self._fds.extend(fds)
        return count < room

    def close(self) -> None:
        # Once, under a lock: the exit handler (on the event loop) and an unloading thread both
        # close, and a shutdown of a number the other just closed could hit whatever reused it.
        with self._close_lock:
            if self.sock.fileno() < 0:
                return
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        with self._send_lock:
            for _, fds in self._backlog:
                _close_all(fds)
            self._backlog.clear()


def _carrying(fds: tuple[int, ...]) -> list[tuple[int, int, array.array[int]]]:
    """sendmsg's ancillary data that passes the descriptors to the peer (SCM_RIGHTS)."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]


def _own(fds: tuple[int, ...]) -> tuple[int, ...]:
    """Copies of descriptors that wait in a backlog: the caller may close its own meanwhile."""
    return tuple(os.dup(fd) for fd in fds)


def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def flat_frees(items: list[tuple[int, int]]) -> list[int]:
    return [value for pair in items for value in pair]


def pairs(flat: list[int]) -> list[tuple[int, int]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


# -- tensors across the boundary -------------------------------------------------------------


def tensor_ref(arena: Arena, name: str, datatype: str, array: np.ndarray, room: InlineRoom) -> TensorRef:
    """`array` for the other side: copied into its message (whose inline `room` it takes) when
    small and the message has room, else into `arena`."""
    shape = list(array.shape)
    if datatype == "BYTES":
        payload = serialize_bytes(array)
        size = len(payload)
        if size <= INLINE_MAX and size <= room.left:
            room.left -= size
            return TensorRef(name, datatype, shape, INLINE, 0, size, payload)  # type: ignore[arg-type]
        segment, offset, nbytes = arena.write_bytes(payload)
    elif array.nbytes <= INLINE_MAX and array.nbytes <= room.left:
        room.left -= array.nbytes
        # A copy now, not a view: the model may reuse its output buffer before the message goes.
        return TensorRef(name, datatype, shape, INLINE, 0, array.nbytes, array.tobytes())  # type: ignore[arg-type]
    else:
        segment, offset, nbytes = arena.write(array)
    return TensorRef(name, datatype, shape, segment, offset, nbytes)


def tensor_array(segments: SegmentMap, ref: TensorRef, dtype: np.dtype[Any]) -> np.ndarray:
    """The array `tensor_ref` sent (`dtype`: its numpy type; unused for BYTES). Arena tensors
    are views of the other side's segment, given back once the last array over them is gone."""
    shape = tuple(ref.shape)
    if ref.segment == INLINE:
        if ref.datatype == "BYTES":
            return deserialize_bytes(ref.data, shape)
        return np.frombuffer(ref.data, dtype).reshape(shape)
    if ref.datatype == "BYTES":
        return deserialize_bytes(segments.view(ref.segment, ref.offset, ref.nbytes), shape)  # copies out
    return segments.array(ref.segment, ref.offset, ref.nbytes, dtype, shape)


# -- BYTES tensors ---------------------------------------------------------------------------


def serialize_bytes(array_: np.ndarray) -> bytes:
    """Triton's BYTES wire form: each element as a 4-byte little-endian length and its bytes."""
    parts = []
    for item in array_.reshape(-1):
        value = item if isinstance(item, bytes) else (item.encode() if isinstance(item, str) else bytes(item))
        parts.append(_LENGTH.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def deserialize_bytes(buffer: memoryview | bytes | bytearray | np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The object array of `bytes` that `serialize_bytes` wrote."""
    data = bytes(buffer)
    count = int(np.prod(shape)) if shape else 1
    result = np.empty(count, dtype=object)
    position = 0
    for i in range(count):
        (length,) = _LENGTH.unpack_from(data, position)
        position += 4
        result[i] = data[position : position + length]
        position += length
    return result.reshape(shape)


# -- custom metrics (pb_utils.MetricFamily / Metric) ----------------------------------------------


class MetricFamilyDeclared(msgspec.Struct, tag=True, array_like=True):
    name: str
    description: str
    kind: str  # "counter", "gauge" or "histogram"


class MetricSeriesAcquired(msgspec.Struct, tag=True, array_like=True):
    """The process created series `series` (its own id) of `family` with these labels."""

    series: int
    family: str
    labels: dict[str, str]
    buckets: list[float] | None = None


class MetricSeriesUpdated(msgspec.Struct, tag=True, array_like=True):
    """Changes since the last update: a gauge value set at `set_ns` (monotonic clock), then
    `add`; histogram observations as counts per bucket (+Inf last) and their sum."""

    series: int
    add: float = 0.0
    set_value: float | None = None
    set_ns: int = 0
    bucket_adds: list[int] = []
    sum_add: float = 0.0


class MetricSeriesReleased(msgspec.Struct, tag=True, array_like=True):
    series: int


MetricChange = MetricFamilyDeclared | MetricSeriesAcquired | MetricSeriesUpdated | MetricSeriesReleased


class CustomMetrics(msgspec.Struct, tag=True, array_like=True):
    """model process -> server: custom-metric changes, in order. `epoch` names the process (a
    restarted process of the same instance has another one)."""

    epoch: int
    changes: list[MetricChange]


class MetricValue(msgspec.Struct, tag=True, array_like=True):
    """model process -> server: the registry's value of one of its series, answered by `Answer`."""

    call: int
    series: int


class MetricRejected(msgspec.Struct, tag=True, array_like=True):
    """server -> model process: the registry refused a family (series 0) or a series."""

    family: str
    series: int
    error: str


# The channel decodes every message of the union as it stands once the module is loaded.
Message = Message | CustomMetrics | MetricValue | MetricRejected  # type: ignore[misc]
