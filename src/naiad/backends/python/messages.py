"""Messages between the server and a Python model's process, and the socket they travel on.

Control messages are msgspec msgpack structs on the server's channel (`naiad.channel`); tensor
payloads over `INLINE_MAX` bytes never travel here, only where they lie in shared memory
(`TensorRef`). New shared-memory segments travel as file descriptors attached to their `Segment`
message. Messages carry the locations the sender has finished reading (`frees`, flat [segment,
offset, ...]) so the other side can reuse them without a message of their own.

Imports only the standard library, numpy, msgspec and `naiad.channel`: it runs inside model
processes too.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from naiad.channel import Channel as _Channel
from naiad.channel import ChannelClosed as ChannelClosed  # re-exported: the Python backend's name for it

if TYPE_CHECKING:
    from naiad.backends.python.shm import Arena, SegmentMap

_LENGTH = struct.Struct("<I")  # a BYTES element's length


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


class Channel(_Channel[Message]):
    """The shared channel (`naiad.channel`) carrying a Python model's messages: `Segment`
    messages bring their shared-memory segment's descriptor (`take_fd`)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, _DECODER)


def flat_frees(items: list[tuple[int, int]]) -> list[int]:
    return [value for pair in items for value in pair] if items else []


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
_DECODER: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)
