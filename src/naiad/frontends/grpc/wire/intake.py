"""The reading side of one connection: the client preface, frames cut from the byte stream, how
long unfinished input may wait, and when reading pauses.

- Slow clients: the preface and a first frame must come within --grpc-handshake-timeout-secs of
  the connection (gRPC core's handshake timeout), and a frame or header block once begun must be
  finished within it of the last whole frame, else `on_timeout` closes the connection.
- Reading pauses while the socket's send buffer is full ("writes": the client is not reading
  what it asked for, so whatever it asks next would pile up unsent too), and for one loop
  iteration after every FRAMES_PER_TURN frames or BYTES_PER_TURN bytes ("turn"): uvloop reads
  a busy socket up to 32 times per iteration, and without the pause one client streaming tiny
  frames (or megabytes of requests) could hold the loop for seconds while every other
  connection waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from naiad.frontends.connections import ReadPauses
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.timers import Timer

FRAMES_PER_TURN = 4096
BYTES_PER_TURN = 1 << 20


class Intake:
    def __init__(self, max_frame: int, timeout: float, on_timeout: Callable[[bytes], None]) -> None:
        self.reader = f.FrameReader(max_frame)
        self.timeout = timeout  # 0: unfinished input may wait for ever
        self.on_timeout = on_timeout  # called with the GOAWAY's debug text
        self.transport: asyncio.Transport | None = None
        self.preface: bytes | None = b""  # the client preface received so far; None once complete
        self.first_frame = False
        self.progress = time.monotonic()  # when the last whole frame came
        self.turn_frames = 0
        self.turn_bytes = 0
        self.pauses = ReadPauses()
        self.deadline = Timer(self._timed_out)
        self.block_open: Callable[[], bool] = lambda: False  # a header block awaits its CONTINUATION

    def start(self, transport: asyncio.Transport) -> None:
        self.transport = self.pauses.transport = transport
        if self.timeout > 0:
            self.deadline.start(self.timeout)

    def stop(self) -> None:
        self.deadline.cancel()
        self.transport = self.pauses.transport = None

    def frames(self, data: bytes) -> list[f.Frame]:
        """The frames `data` completes (ProtocolError for a bad preface or an oversized frame)."""
        self.turn_bytes += len(data)
        if self.preface is not None:
            data = self._take_preface(data)
        return self.reader.feed(data)

    def took(self, count: int, now: float) -> None:
        """After each read (`count` whole frames): time what is left unfinished, and yield the
        loop now and then."""
        if count:
            self.first_frame = True
            self.progress = now
        if self.first_frame and not (self.reader.partial or self.block_open()):
            self.deadline.cancel()
        elif not self.deadline.armed and self.timeout > 0:
            self.deadline.start(self.timeout)
        self.turn_frames += count
        if self.turn_frames >= FRAMES_PER_TURN or self.turn_bytes >= BYTES_PER_TURN:
            self.turn_frames = self.turn_bytes = 0
            self.pauses.pause("turn")
            asyncio.get_running_loop().call_soon(self.pauses.resume, "turn")

    def _take_preface(self, data: bytes) -> bytes:
        received = self.preface or b""
        need = len(f.PREFACE) - len(received)
        received += data[:need]
        if not f.PREFACE.startswith(received):
            raise f.ProtocolError("not an HTTP/2 client (bad connection preface)")
        self.preface = None if len(received) == len(f.PREFACE) else received
        return data[need:]

    def _timed_out(self) -> None:
        if not self.first_frame:
            self.on_timeout(b"HTTP/2 preface and first frame not received in time")
            return
        if not (self.reader.partial or self.block_open()):
            return
        left = self.progress + self.timeout - time.monotonic()
        if left > 0:
            self.deadline.start(left)  # frames kept coming: time the one now unfinished
            return
        self.on_timeout(b"frame not completed in time")
