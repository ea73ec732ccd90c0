"""Messages between the server and a child process of its own, on a Unix stream socket.

Two kinds of child talk to the server this way: a Python model's process
(`naiad.backends.python`) and an LLM engine core (`naiad.llm.engine.engine_core`). Each message
is msgpack (msgspec), length-prefixed; file descriptors may ride along (`send(..., fds=...)`).

The server's end is read by its event loop, which must never wait for the child: were it to
wait to send while the child waits for it to read an answer, the whole server would stop, and a
child busy for a while (a model's execute, an LLM step) reads nothing meanwhile. So a channel
the loop reads (`never_wait`) keeps what the socket cannot take now in a backlog, in order, and
the loop sends the rest when the socket has room. The child's end blocks, as a child may.

Imports only the standard library and msgspec: it runs inside model processes too.
"""

from __future__ import annotations

import array
import collections
import contextlib
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

log = logging.getLogger(__name__)

M = TypeVar("M")

#: `watch(fd, callback)`: call `callback` from the server's event loop while `fd` is readable
#: (or writable); returns what stops that (callable from any thread), or None without a loop
#: (`naiad.backends.base.Host.watch` and `watch_writable`).
Watch = Callable[[int, Callable[[], None]], Callable[[], None] | None]

_LENGTH = struct.Struct("<I")
READ_SIZE = 1 << 18  # the most one read takes (more when a message is larger)
_ANCILLARY = socket.CMSG_SPACE(16 * 4)  # room for the descriptors of a few segments


class ChannelClosed(Exception):
    """The other side closed the socket or died."""


class Channel(Generic[M]):
    """Length-prefixed msgpack messages on a Unix stream socket, decoded by `decoder`; `send` is
    thread-safe, `recv` belongs to one reader at a time. See the module's docstring."""

    def __init__(self, sock: socket.socket, decoder: msgspec.msgpack.Decoder[M]) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = decoder
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._out = bytearray()  # reused for every frame (under the send lock)
        self._wait_when_full = True
        self._backlog: collections.deque[tuple[bytes, tuple[int, ...]]] = collections.deque()
        self._watch_writable: Watch | None = None  # the loop's, once `never_wait` was called
        self._stop_writing: Callable[[], None] | None = None  # stops the loop's sending of a backlog
        # Incoming bytes land in one reused buffer between _start and _end: no allocation per read.
        self._in = bytearray(READ_SIZE)
        self._view = memoryview(self._in)  # (kept: one view per buffer, not one per read; _fill replaces both)
        self._start = 0
        self._end = 0
        self._fds: collections.deque[int] = collections.deque()
        self._closed = False  # end of stream seen while messages were still to be handed out
        # A blocking reader waits for input here, not inside recvmsg: see `_wait_readable`.
        self._input = select.poll()
        self._input.register(sock, select.POLLIN)

    # -- sending -----------------------------------------------------------------------------

    def send(self, message: Any, fds: tuple[int, ...] = ()) -> None:
        self.send_many((message,), fds)

    def send_many(self, messages: Sequence[Any], fds: tuple[int, ...] = ()) -> None:
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
        if started:  # outside the lock: arming the watch waits for the loop
            self._backlog_started()

    def never_wait(self, watch_writable: Watch) -> None:
        """From now on sends never wait for the other side to read: for the end an event loop
        reads (non-blocking socket). What the socket cannot take waits in a backlog, which the
        loop sends when `watch_writable` says the socket has room."""
        self._watch_writable = watch_writable
        self._wait_when_full = False

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

    def _backlog_started(self) -> None:
        """A backlog just started (any thread): have the loop send it when the socket has room."""
        watch_writable = self._watch_writable
        assert watch_writable is not None
        stop = watch_writable(self.sock.fileno(), self._writable)
        if stop is None:  # the loop is gone (shutting down): nobody reads either, send it here
            self.sock.setblocking(True)
            self._wait_when_full = True
            with contextlib.suppress(ChannelClosed):
                self._send_backlog_waiting()
            return
        self._stop_writing = stop

    def _writable(self) -> None:
        """On the loop, while the socket has room and a backlog waits."""
        try:
            done = self.send_backlog()
        except ChannelClosed:
            done = True  # the reader sees the end and fails what was in flight
        stop = self._stop_writing
        if done and stop is not None:
            stop()  # a backlog started meanwhile on another thread arms a new watch after this

    def _send_backlog_waiting(self) -> None:
        while not self.send_backlog():
            select.select([], [self.sock], [])

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

    # -- receiving ---------------------------------------------------------------------------

    def has_frame(self) -> bool:
        """Whether a whole message already waits in the buffer (recv would not block)."""
        return self._end - self._start >= self._frame_size()

    def _frame_size(self) -> int:
        """The bytes the next message takes in the buffer, its length included (4 while even
        its length is not all there)."""
        if self._end - self._start < 4:
            return 4
        return 4 + int(_LENGTH.unpack_from(self._in, self._start)[0])

    def poll(self, timeout: float | None) -> bool:
        """Whether a message (or the first of its bytes, or the end of the stream) is here, waiting
        up to `timeout` seconds (None: for ever) for one, as `Connection.poll`."""
        if self.has_frame():
            return True
        return bool(self._input.poll(None if timeout is None else int(timeout * 1000)))

    def recv(self) -> M:
        """The next message; raises ChannelClosed at end of stream."""
        while True:
            need = self._frame_size()
            if self._end - self._start >= need:
                begin, end = self._start + 4, self._start + need
                # Past the frame before decoding it: a frame that fails to decode is dropped,
                # not met again by every later read.
                self._start = end
                if self._start == self._end:
                    self._start = self._end = 0  # (the bytes stay until the next read)
                return self._decoder.decode(self._view[begin:end])
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

    def recv_ready(self) -> list[M]:
        """The whole messages that are here now (non-blocking socket), for an event loop that
        calls again while the socket stays readable (asyncio's readers are level-triggered);
        raises ChannelClosed at end of stream, after the messages before it were returned. A
        message that does not decode is logged and dropped: it must not cost the others."""
        messages: list[M] = []
        drained = False
        while True:
            self._take_whole(messages)
            if drained:
                # The last read took less than it was offered: the socket was empty, and reading
                # again would only fail (EAGAIN). Bytes that arrive later wake the loop again.
                return messages
            try:
                drained = self._fill(self._frame_size())  # room for all of a large message
            except BlockingIOError:
                return messages
            except ChannelClosed:
                if messages:
                    self._closed = True
                    return messages
                raise

    def _take_whole(self, messages: list[M]) -> None:
        """Decode every whole message in the buffer onto `messages`, leaving a partial one where it
        is; one that does not decode is logged and dropped. (`recv`'s work, in one loop over
        locals: the event loop calls this for every answer a model process or engine core sends.)"""
        start, end, data = self._start, self._end, self._in
        while end - start >= 4:
            stop = start + 4 + _LENGTH.unpack_from(data, start)[0]
            if stop > end:
                break
            begin = start + 4
            start = self._start = stop  # past the frame before decoding it, as recv
            try:
                messages.append(self._decoder.decode(self._view[begin:stop]))
            except msgspec.DecodeError:
                log.exception("a message on the channel could not be decoded (dropped)")
        if start == end:
            self._start = self._end = 0  # (the bytes stay until the next read)

    def take_fd(self) -> int:
        """The descriptor that came with the message just received (a Python model's `Segment`)."""
        return self._fds.popleft()

    def _fill(self, need: int) -> bool:
        """Read more bytes, first making room for a frame of `need` bytes from `_start`; True
        when the read took less than the room it was offered (the socket had no more)."""
        if len(self._in) - self._start < max(need, READ_SIZE // 4):
            pending = self._in[self._start : self._end]
            size = max(READ_SIZE, 2 * need)
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
        """Stop the loop's sending of a backlog, then close the socket (once, however many call)."""
        stop = self._stop_writing
        if stop is not None:
            stop()  # before the socket closes: its number may be reused at once
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
