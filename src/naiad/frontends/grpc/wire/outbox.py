"""Everything one connection sends, and the limits on what it may hold unsent.

Frames emitted while the connection handles a read, or by calls that finish in the same loop
iteration, go out together in one write. A call's DATA goes out as far as the client's
flow-control windows allow and only while the socket takes it (write back-pressure: asyncio's
pause_writing); the rest waits here, per stream, followed by the stream's trailers. What waits is
bounded twice, for slow or hostile readers:

- in bytes: a response that would start waiting while the connection already holds
  --grpc-max-unsent-bytes is refused (`data` returns False: the call fails RESOURCE_EXHAUSTED);
  a streaming writer waits for room (`room`) before it writes again;
- in time: a stream whose DATA made no progress for --grpc-send-timeout-secs is reported to the
  connection (`on_stalled`), which resets it; so is a streaming writer that waited that long
  for room.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.flow import FlowControl
from naiad.frontends.grpc.wire.timers import Timer


class _Waiting:
    """One stream's DATA that could not go out yet, then its trailers."""

    __slots__ = ("pieces", "progress", "size", "trailers")

    def __init__(self, now: float) -> None:
        self.pieces: deque[memoryview] = deque()
        self.size = 0
        self.trailers: bytes | None = None
        self.progress = now  # when the stream last sent something (or began waiting)


class Outbox:
    """One connection's outgoing frames; the connection calls `flush` after each read."""

    def __init__(self, flow: FlowControl, max_unsent: int, send_timeout: float,
                 on_done: Callable[[int], None], on_stalled: Callable[[int], None],
                 on_data: Callable[[], None]) -> None:
        self.flow = flow
        self.max_unsent = max_unsent or 2**62  # 0: no limit
        self.send_timeout = send_timeout
        self.on_done = on_done  # a stream's trailers went out
        self.on_stalled = on_stalled  # a stream sent nothing for send_timeout
        self.on_data = on_data  # DATA went out (pings are welcome again: keepalive.py)
        self.transport: asyncio.Transport | None = None
        # set with the transport: asyncio.get_running_loop() makes a getpid() system call on 3.11
        self.loop: asyncio.AbstractEventLoop | None = None
        self.max_frame = f.DEFAULT_MAX_FRAME  # the client's SETTINGS_MAX_FRAME_SIZE
        self.out: list[bytes | memoryview] = []
        self.flush_scheduled = False
        self.waiting: dict[int, _Waiting] = {}
        self.unsent = 0  # bytes of DATA in `waiting`
        self.paused = False  # the socket's buffer is full (asyncio's pause_writing)
        self._room = asyncio.Event()
        self._room.set()
        self._stall_timer = Timer(self._check_stalls)

    # -- frames -----------------------------------------------------------------------------

    def emit(self, data: bytes | memoryview) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            (self.loop or asyncio.get_running_loop()).call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    # -- a stream's DATA and trailers -------------------------------------------------------

    def data(self, stream_id: int, pieces: list[bytes], size: int) -> bool:
        """Send `size` bytes of DATA made of `pieces` on the stream, now or once the windows and
        the socket allow. False (nothing queued) when it would have to wait while the connection
        already holds max_unsent bytes."""
        waiting = self.waiting.get(stream_id)
        if waiting is None:
            if not self.paused and size <= self.flow.budget(stream_id, self.max_frame):
                self._frame(stream_id, pieces, size)  # the common case: one frame, at once
                return True
            if self.unsent >= self.max_unsent:
                return False
            waiting = self.waiting[stream_id] = _Waiting(time.monotonic())
            if not self._stall_timer.armed and self.send_timeout > 0:
                self._stall_timer.start(self.send_timeout)
        waiting.pieces.extend(memoryview(piece) for piece in pieces)
        waiting.size += size
        self.unsent += size
        if self.unsent >= self.max_unsent:
            self._room.clear()
        self.drain(stream_id)
        return True

    def unary(self, stream_id: int, headers: bytes, pieces: list[bytes], size: int, trailers: bytes,
              now: bool = False) -> bool:
        """A unary call's whole answer, HEADERS, its message as one DATA frame and the trailers,
        queued in one go when the windows and the socket take the message now (nearly always);
        False: nothing was queued (send it with `data` and `trailers`). `now`: written at once,
        with whatever else waits, unless a flush is coming anyway (the end of the read being
        handled, or of this turn of the loop), which it then joins. The caller reports the DATA
        and the stream's end itself (no `on_data` or `on_done` from here)."""
        if self.paused or stream_id in self.waiting or size > self.flow.budget(stream_id, self.max_frame):
            return False
        out = self.out
        out.append(f.frame(f.HEADERS, f.END_HEADERS, stream_id, headers))
        out.append(f.head(f.DATA, 0, stream_id, size))
        out.extend(pieces)
        self.flow.spend(stream_id, size)
        end = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, trailers)
        if now and not self.flush_scheduled:
            out.append(end)
            self.flush()
        else:
            self.emit(end)  # (and the flush)
        return True

    def trailers(self, stream_id: int, block: bytes) -> None:
        """End the stream with `block` once its DATA is out."""
        waiting = self.waiting.get(stream_id)
        if waiting is None:
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block))
            self.on_done(stream_id)
        else:
            waiting.trailers = block

    def drain(self, stream_id: int) -> None:
        """Send the stream's waiting DATA as far as the windows and the socket allow, then its
        trailers once nothing is left."""
        waiting = self.waiting.get(stream_id)
        if waiting is None:
            return
        flow = self.flow
        sent = False
        while waiting.pieces and not self.paused:
            budget = flow.budget(stream_id, self.max_frame)
            if budget <= 0:
                break
            self._frame_of(stream_id, waiting, budget)
            sent = True
        if sent:
            waiting.progress = time.monotonic()
            self.on_data()
        if waiting.pieces:
            return
        del self.waiting[stream_id]
        if waiting.trailers is not None:
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, waiting.trailers))
            self.on_done(stream_id)

    def drain_all(self) -> None:
        for stream_id in list(self.waiting):
            self.drain(stream_id)

    def drop(self, stream_id: int) -> None:
        """Forget what the stream has waiting (it was reset)."""
        waiting = self.waiting.pop(stream_id, None)
        if waiting is not None:
            self._sent(waiting.size)

    def has_waiting(self, stream_id: int) -> bool:
        return stream_id in self.waiting

    # -- back-pressure ----------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self._room.clear()

    def resume(self) -> None:
        self.paused = False
        if self.unsent < self.max_unsent:
            self._room.set()
        self.drain_all()

    async def room(self) -> bool:
        """Wait while the socket is full or the connection holds max_unsent bytes; False when
        no room came within the send timeout."""
        if self._room.is_set():
            return True
        if self.send_timeout <= 0:
            await self._room.wait()
            return True
        try:
            await asyncio.wait_for(self._room.wait(), self.send_timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """The connection is gone: drop everything, wake every writer."""
        self.waiting.clear()
        self.unsent = 0
        self._stall_timer.cancel()
        self._room.set()

    # -- internals --------------------------------------------------------------------------

    def _frame(self, stream_id: int, pieces: list[bytes], size: int) -> None:
        self.emit(f.head(f.DATA, 0, stream_id, size))
        self.out.extend(pieces)
        self.flow.spend(stream_id, size)
        self.on_data()

    def _frame_of(self, stream_id: int, waiting: _Waiting, budget: int) -> None:
        taken = 0
        pending = waiting.pieces
        chunks: list[memoryview] = []
        while pending and taken < budget:
            piece = pending[0]
            room = budget - taken
            if len(piece) <= room:
                chunks.append(pending.popleft())
                taken += len(piece)
            else:
                chunks.append(piece[:room])
                pending[0] = piece[room:]
                taken += room
        self.emit(f.head(f.DATA, 0, stream_id, taken))
        self.out.extend(chunks)
        self.flow.spend(stream_id, taken)
        waiting.size -= taken
        self._sent(taken)

    def _sent(self, size: int) -> None:
        self.unsent -= size
        if self.unsent < self.max_unsent and not self.paused and not self._room.is_set():
            self._room.set()

    def _check_stalls(self) -> None:
        """Streams that sent nothing for send_timeout are reported; check again for the rest."""
        now = time.monotonic()
        for stream_id, waiting in list(self.waiting.items()):
            if now - waiting.progress >= self.send_timeout:
                self.on_stalled(stream_id)
        if self.waiting:
            oldest = min(waiting.progress for waiting in self.waiting.values())
            self._stall_timer.start(max(oldest + self.send_timeout - now, 0.01))
