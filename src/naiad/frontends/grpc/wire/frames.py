"""HTTP/2 frames (RFC 9113) as gRPC needs them: constants, encoders and a reader.

Pure functions and one small class; the connection decides what the frames mean.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7))
# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 6, 7, 8, 9, 11

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1  # the largest SETTINGS_MAX_FRAME_SIZE

_HEAD = struct.Struct(">BHBBI")  # length as 1 + 2 bytes, type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")


class ProtocolError(Exception):
    """A connection error: the peer broke HTTP/2; answer with GOAWAY `code` and close."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Frame(NamedTuple):
    kind: int
    flags: int
    stream_id: int
    payload: bytes


def head(kind: int, flags: int, stream_id: int, size: int) -> bytes:
    """The 9-byte header of a frame whose payload (`size` bytes) is written separately."""
    return _HEAD.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEAD.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return dict(_SETTING.iter_unpack(payload))


def parse_u32(payload: bytes, what: str) -> int:
    if len(payload) != 4:
        raise ProtocolError(f"{what} payload must be 4 bytes", FRAME_SIZE_ERROR)
    return int(_U32.unpack(payload)[0]) & MAX_WINDOW


def unpad(flags: int, payload: bytes) -> bytes:
    """The payload of a DATA or HEADERS frame without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding exceeds the frame payload")
    return payload[1:len(payload) - payload[0]]


class FrameReader:
    """Cuts a byte stream into frames; a frame longer than `max_frame_size` is a FRAME_SIZE_ERROR."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        """Part of a frame is buffered, waiting for the rest."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        buffer = self._buffer
        # Frames are cut from `data` itself when nothing was left over (most reads): a slice of
        # bytes is the payload, where one of the buffer would be copied twice.
        source: bytes | bytearray = data
        if buffer:
            buffer += data
            source = buffer
        frames: list[Frame] = []
        start, end = 0, len(source)
        while end - start >= 9:
            high, low, kind, flags, stream_id = _HEAD.unpack_from(source, start)
            size = high << 16 | low
            if size > self.max_frame_size:
                raise ProtocolError(f"frame of {size} bytes exceeds the maximum {self.max_frame_size}",
                                    FRAME_SIZE_ERROR)
            if end - start - 9 < size:
                break
            body = start + 9
            frames.append(Frame(kind, flags, stream_id & MAX_WINDOW, bytes(source[body:body + size])))
            start = body + size
        if source is buffer:
            del buffer[:start]
        elif start < end:
            buffer += data[start:]  # the start of a frame whose rest comes later
        return frames
