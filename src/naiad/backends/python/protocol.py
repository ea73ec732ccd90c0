"""Messages between the server and a Python model's process, and the socket they travel on.

Control messages are msgspec msgpack structs, length-prefixed on a Unix stream socket; tensor
payloads never travel here, only where they lie in shared memory (`TensorRef`). New shared-memory
segments travel as file descriptors attached to their `Segment` message. Messages carry the
locations the sender has finished reading (`frees`, flat [segment, offset, ...]) so the other
side can reuse them without a message of their own.

Imports only the standard library, numpy and msgspec: it runs inside model processes too.
"""

from __future__ import annotations

import array
import collections
import contextlib
import socket
import struct
import threading
from typing import Any

import msgspec
import numpy as np

_LENGTH = struct.Struct("<I")


class TensorRef(msgspec.Struct, array_like=True):
    """A tensor in the sender's arena. BYTES tensors hold Triton's serialized form there
    (4-byte little-endian length before each element)."""

    name: str
    datatype: str  # V2 name: FP32, BYTES, ...
    shape: list[int]
    segment: int
    offset: int
    nbytes: int


class Request(msgspec.Struct, array_like=True):
    id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters: str  # JSON object, as pb_utils hands it to the model
    outputs: list[str]
    inputs: list[TensorRef]


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
    """The reply to a `Query` (is_cancelled, model control): a value or an error."""

    call: int
    value: Any = None
    error: str | None = None


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    pass


# -- model process -> server -----------------------------------------------------------------


class Ready(msgspec.Struct, tag=True, array_like=True):
    error: str | None = None


class AutoCompleted(msgspec.Struct, tag=True, array_like=True):
    config: str | None = None  # JSON, or None when the model has no auto_complete_config
    error: str | None = None


class Executed(msgspec.Struct, tag=True, array_like=True):
    """`execute` returned for `batch`: the responses it returned (and any sent before), or the
    exception it raised, which fails every request of the batch still open."""

    batch: int
    responses: list[Response]
    error: str | None = None
    frees: list[int] = []


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
    belongs to one reader thread. File descriptors ride on `send(..., fds=...)`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._send_lock = threading.Lock()
        self._buffer = bytearray()
        self._fds: collections.deque[int] = collections.deque()

    def send(self, message: Message, fds: tuple[int, ...] = ()) -> None:
        payload = self._encoder.encode(message)
        frame = _LENGTH.pack(len(payload)) + payload
        with self._send_lock:
            try:
                if fds:
                    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self.sock.sendmsg([frame], ancillary)
                    if sent < len(frame):
                        self.sock.sendall(frame[sent:])
                else:
                    self.sock.sendall(frame)
            except OSError as error:
                raise ChannelClosed(str(error)) from error

    def recv(self) -> Message:
        """The next message; raises ChannelClosed at end of stream."""
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer)
                if len(buffer) >= 4 + length:
                    message = self._decoder.decode(memoryview(buffer)[4 : 4 + length])
                    del buffer[: 4 + length]
                    return message
            self._fill()

    def take_fd(self) -> int:
        """The descriptor that came with the `Segment` message just received."""
        return self._fds.popleft()

    def _fill(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(1 << 18, socket.CMSG_SPACE(16 * 4))
        except OSError as error:
            raise ChannelClosed(str(error)) from error
        if not data:
            raise ChannelClosed("the other side closed the connection")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self._fds.extend(fds)
        self._buffer += data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def flat_frees(items: list[tuple[int, int]]) -> list[int]:
    return [value for pair in items for value in pair]


def pairs(flat: list[int]) -> list[tuple[int, int]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


# -- BYTES tensors ---------------------------------------------------------------------------


def serialize_bytes(array_: np.ndarray) -> bytes:
    """Triton's BYTES wire form: each element as a 4-byte little-endian length and its bytes."""
    parts = []
    for item in array_.reshape(-1):
        value = item if isinstance(item, bytes) else (item.encode() if isinstance(item, str) else bytes(item))
        parts.append(_LENGTH.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def deserialize_bytes(buffer: memoryview | bytes | np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
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
