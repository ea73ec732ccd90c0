"""A lean gRPC client over HTTP/2 on asyncio, for load generation.

grpcio's client costs more CPU per call than the server it measures; this one writes one HEADERS
and one DATA frame per call, both encoded once per connection (the request header block uses no
HPACK dynamic table, so it never changes), and reads back only what it needs: the status in the
trailers (header blocks are decoded by `hpack`, and a block seen before that left the decoder's
table as it was is answered from a cache) and, for control calls, the message.

It speaks what a gRPC server expects of a client: the preface, SETTINGS and their ACKs, PING
ACKs, flow control in both directions (large request messages wait for window), GOAWAY.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 4, 5
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
_HEADER = struct.Struct(">I")
_DECODE_CACHE_LIMIT = 256

#: done(stream_owner, ok, error, message); message only for calls that keep it.
OnCallDone = Callable[[Any, bool, str, bytes], None]


class H2Error(RuntimeError):
    """The connection failed or a control call did not succeed."""


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix, OR-ed into `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return _int(len(raw), 7, 0) + raw


def request_block(path: str, authority: str, extra: dict[str, str] | None = None) -> bytes:
    """A gRPC request's header block with static-table references and literals without indexing
    only: it leaves the server's decoder table untouched, so the same bytes serve every call."""
    block = b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
    block += _int(4, 4, 0) + _string(path)  # :path (name index 4), literal without indexing
    block += _int(1, 4, 0) + _string(authority)  # :authority (1)
    block += _int(31, 4, 0) + _string("application/grpc")  # content-type (31)
    for name, value in {"te": "trailers", **(extra or {})}.items():
        block += b"\x00" + _string(name.lower()) + _string(value)
    return block


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(len(payload))[1:] + bytes((kind, flags)) + _HEADER.pack(stream) + payload


def grpc_message(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + _HEADER.pack(len(message)) + message


class _Stream:
    __slots__ = ("data", "keep", "owner", "status", "window")

    def __init__(self, owner: Any, keep: bool, window: int) -> None:
        self.owner = owner
        self.keep = keep
        self.data: list[bytes] | None = [] if keep else None
        self.status = ""
        self.window = window


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying gRPC calls; `on_done` is called once per call."""

    def __init__(self, authority: str, on_done: OnCallDone, metadata: dict[str, str] | None = None) -> None:
        self.authority = authority
        self.on_done = on_done
        self.metadata = metadata or {}
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.ready: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        self._buffer = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._blocks: dict[str, bytes] = {}
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 20
        self._inserts = 0
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._continuation: tuple[int, int, bytearray] | None = None  # (stream, flags, block so far)
        self._send_window = 65535  # the connection's window for what we send
        self._stream_window = 65535  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self._max_frame = 16384
        self._unacked = 0  # bytes received since our last connection WINDOW_UPDATE
        self._waiting: deque[tuple[int, memoryview]] = deque()  # request data held back by flow control
        self._count_inserts()

    def _count_inserts(self) -> None:
        table = self._decoder.header_table
        add = table.add

        def counting_add(name: bytes, value: bytes) -> Any:
            self._inserts += 1
            return add(name, value)

        table.add = counting_add  # type: ignore[method-assign]

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True
        settings = struct.pack(">HIHI", 2, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)  # no push; big windows
        increment = _HEADER.pack(MAX_WINDOW - 65535)
        transport.write(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, increment))  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if not self.ready.done():
            self.ready.set_exception(H2Error(f"connection closed during the HTTP/2 handshake: {exc}"))
        self._fail_streams(0, f"connection lost{': ' + str(exc) if exc else ''}")

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, size = 0, len(buffer)
        while size - start >= 9:
            length = (buffer[start] << 16) | (buffer[start + 1] << 8) | buffer[start + 2]
            end = start + 9 + length
            if end > size:
                break
            kind, flags = buffer[start + 3], buffer[start + 4]
            stream = _HEADER.unpack_from(buffer, start + 5)[0] & MAX_STREAM_ID
            self._frame(kind, flags, stream, bytes(buffer[start + 9:end]))
            start = end
        if start:
            del buffer[:start]

    # -- calls -------------------------------------------------------------------------------

    def call(self, owner: Any, path: str, message: bytes, keep: bool = False) -> None:
        """Start one unary call of `path` with an already length-prefixed `message`."""
        stream = self._next_id
        if stream > MAX_STREAM_ID:
            self.on_done(owner, False, "stream ids exhausted on this connection", b"")
            return
        self._next_id += 2
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = request_block(path, self.authority, self.metadata)
        self._streams[stream] = _Stream(owner, keep, self._stream_window)
        sid = _HEADER.pack(stream)
        head = _HEADER.pack(len(block))[1:] + b"\x01\x04" + sid + block
        size = len(message)
        if not self._waiting and size <= self._send_window and size <= self._stream_window and size <= self._max_frame:
            self._send_window -= size
            self._streams[stream].window -= size
            self.transport.write(head + _HEADER.pack(size)[1:] + b"\x00\x01" + sid + message)  # type: ignore[union-attr]
            return
        self.transport.write(head)  # type: ignore[union-attr]
        self._waiting.append((stream, memoryview(message)))
        self._flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def active(self) -> int:
        return len(self._streams)

    # -- frames ------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            self._abort("expected CONTINUATION")
        elif kind == DATA:
            self._data(flags, stream, payload)
        elif kind == HEADERS:
            self._headers(flags, stream, payload)
        elif kind == CONTINUATION:
            self._more_headers(flags, stream, payload)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == PING:
            if not flags & ACK:
                self.transport.write(frame(PING, ACK, 0, payload))  # type: ignore[union-attr]
        elif kind == RST_STREAM:
            code = _HEADER.unpack(payload[:4])[0] if len(payload) >= 4 else 0
            self._finish(stream, f"stream reset by the server (HTTP/2 error {code})")
        elif kind == GOAWAY:
            last = _HEADER.unpack(payload[:4])[0] & MAX_STREAM_ID if len(payload) >= 8 else 0
            self._next_id = MAX_STREAM_ID + 2  # no new calls here
            self._fail_streams(last, f"GOAWAY from the server: {payload[8:].decode(errors='replace')}")

    def _data(self, flags: int, stream: int, payload: bytes) -> None:
        if flags & PADDED and payload:
            payload = payload[1 : len(payload) - payload[0]]
        self._unacked += len(payload)
        if self._unacked > 1 << 24:  # give the connection window back in large steps
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, _HEADER.pack(self._unacked)))  # type: ignore[union-attr]
            self._unacked = 0
        state = self._streams.get(stream)
        if state is not None and state.data is not None:
            state.data.append(payload)
        if flags & END_STREAM:
            self._finish(stream, "the server ended the stream without trailers")

    def _headers(self, flags: int, stream: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY:
            payload = payload[5:]
        if not flags & END_HEADERS:
            self._continuation = (stream, flags, bytearray(payload))
            return
        self._header_block(flags, stream, payload)

    def _more_headers(self, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream:
            self._abort("unexpected CONTINUATION")
            return
        self._continuation[2].extend(payload)
        if flags & END_HEADERS:
            first_flags, block = self._continuation[1], bytes(self._continuation[2])
            self._continuation = None
            self._header_block(first_flags, stream, block)

    def _header_block(self, flags: int, stream: int, block: bytes) -> None:
        headers = self._decode(block)
        state = self._streams.get(stream)
        if state is None:
            return
        for name, value in headers:
            if name == b"grpc-status":
                state.status = value.decode()
            elif name == b"grpc-message" and state.status != "0":
                state.data = [value]  # the error text, kept for the caller
            elif name == b":status" and value != b"200":
                state.status, state.data = "http " + value.decode(), [b""]
        if flags & END_STREAM:
            self._finish(stream, "")

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        hit = self._cache.get(block)
        if hit is not None:
            return hit
        inserts, size = self._inserts, self._decoder.header_table.maxsize
        try:
            # raw=True: names and values stay bytes (hpack types them as str | bytes)
            headers = cast(list[tuple[bytes, bytes]], list(self._decoder.decode(block, raw=True)))
        except hpack.HPACKError as error:
            self._abort(f"bad header block: {error}")
            return []
        if self._inserts == inserts and self._decoder.header_table.maxsize == size:
            if len(self._cache) >= _DECODE_CACHE_LIMIT:
                self._cache.clear()
            self._cache[block] = headers  # decoding it again would give the same and change nothing
        else:
            self._cache.clear()  # entries that referred to the dynamic table may mean something else now
        return headers

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            return
        for offset in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._stream_window
                self._stream_window = value
                for state in self._streams.values():
                    state.window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self.transport.write(frame(SETTINGS, ACK, 0))  # type: ignore[union-attr]
        if not self.ready.done():
            self.ready.set_result(None)
        self._flush()

    def _window_update(self, stream: int, payload: bytes) -> None:
        increment = _HEADER.unpack(payload[:4])[0] & MAX_WINDOW if len(payload) >= 4 else 0
        if stream == 0:
            self._send_window += increment
        elif (state := self._streams.get(stream)) is not None:
            state.window += increment
        self._flush()

    def _flush(self) -> None:
        """Send held-back request data as far as the windows allow, in frames the server takes."""
        while self._waiting and self.transport is not None:
            stream, view = self._waiting[0]
            state = self._streams.get(stream)
            if state is None:
                self._waiting.popleft()
                continue
            room = min(self._send_window, state.window, self._max_frame)
            if room <= 0 and view:
                return
            chunk, rest = view[:room], view[room:]
            self._send_window -= len(chunk)
            state.window -= len(chunk)
            last = not rest
            self.transport.write(frame(DATA, END_STREAM if last else 0, stream, bytes(chunk)))
            if last:
                self._waiting.popleft()
            else:
                self._waiting[0] = (stream, rest)

    def _finish(self, stream: int, error: str) -> None:
        state = self._streams.pop(stream, None)
        if state is None:
            return
        if state.status == "0" and not error:
            self.on_done(state.owner, True, "", b"".join(state.data) if state.data is not None else b"")
            return
        if state.status and state.status != "0":
            detail = b"".join(state.data or []).decode(errors="replace")
            error = f"gRPC status {state.status}{': ' + _unescape(detail) if detail else ''}"
        self.on_done(state.owner, False, error or "no grpc-status in the trailers", b"")

    def _fail_streams(self, above: int, why: str) -> None:
        for stream in [s for s in self._streams if s > above]:
            self._finish(stream, why)

    def _abort(self, why: str) -> None:
        self._fail_streams(0, why)
        self.close()


def _unescape(text: str) -> str:
    """grpc-message is percent-encoded."""
    from urllib.parse import unquote

    return unquote(text)


async def connect(host: str, port: int, on_done: OnCallDone, metadata: dict[str, str] | None = None,
                  timeout_s: float = 10.0) -> H2Connection:
    """Open a connection and wait for the server's SETTINGS."""
    loop = asyncio.get_running_loop()
    authority = f"{host}:{port}"
    try:
        _, conn = await loop.create_connection(lambda: H2Connection(authority, on_done, metadata), host, port)
    except OSError as error:
        raise H2Error(f"cannot connect to {authority}: {error.strerror or error}") from None
    try:
        await asyncio.wait_for(conn.ready, timeout_s)
    except TimeoutError:
        conn.close()
        raise H2Error(f"{authority} sent no HTTP/2 SETTINGS within {timeout_s:.0f} s (not a gRPC server?)") from None
    return conn


class GrpcControl:
    """Unary control calls (metadata, config, statistics, repository) on one connection."""

    def __init__(self, host: str, port: int, metadata: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        self.host, self.port, self.metadata, self.timeout_s = host, port, metadata, timeout_s
        self._conn: H2Connection | None = None

    @staticmethod
    def _on_done(owner: Any, ok: bool, error: str, message: bytes) -> None:
        if not owner.done():
            owner.set_result((ok, error, message))

    async def call(self, method: str, request: bytes) -> bytes:
        """The serialized response of `/inference.GRPCInferenceService/METHOD`; H2Error on failure."""
        if self._conn is None or not self._conn.open or self._conn._next_id > MAX_STREAM_ID:
            self._conn = await connect(self.host, self.port, self._on_done, self.metadata)
        answer: asyncio.Future[tuple[bool, str, bytes]] = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        self._conn.call(answer, f"/inference.GRPCInferenceService/{method}", grpc_message(request), keep=True)
        try:
            ok, error, message = await asyncio.wait_for(answer, self.timeout_s)
        except TimeoutError:
            raise H2Error(f"{method}: no answer within {time.monotonic() - started:.0f} s") from None
        if not ok:
            raise H2Error(f"{method}: {error}")
        return message[5:]  # one length-prefixed message

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
