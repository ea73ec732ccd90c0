"""The server's channel to a child process (naiad.channel): framing, descriptors, a reader that
sleeps only for input, and an end read by an event loop that never waits to send."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from naiad import channel
from naiad.channel import Channel, ChannelClosed


class Note(msgspec.Struct, tag=True, array_like=True):
    text: str
    number: int = 0


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


Message = Note | Stop
DECODER: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)


def _pair() -> tuple[Channel[Message], Channel[Message]]:
    left, right = socket.socketpair()
    return Channel(left, DECODER), Channel(right, DECODER)


def test_messages_round_trip_in_order_then_the_end() -> None:
    sender, receiver = _pair()
    sender.send(Note("hello", 1))
    sender.send_many([Note("a", 2), Stop()])
    assert [receiver.recv(), receiver.recv(), receiver.recv()] == [Note("hello", 1), Note("a", 2), Stop()]
    sender.close()
    with pytest.raises(ChannelClosed):
        receiver.recv()
    receiver.close()


def test_poll_says_whether_a_message_is_here_within_the_timeout() -> None:
    sender, receiver = _pair()
    began = time.monotonic()
    assert not receiver.poll(0.05)
    assert time.monotonic() - began >= 0.04
    sender.send_many([Note("one"), Note("two")])
    assert receiver.poll(0)
    assert receiver.recv() == Note("one")
    assert receiver.poll(0)  # the second came with the first read: it is in the buffer, not the socket
    assert receiver.recv() == Note("two")
    assert not receiver.poll(0)
    sender.close()
    assert receiver.poll(None)  # the end of the stream wakes it too
    with pytest.raises(ChannelClosed):
        receiver.recv()


# A child process in miniature: reads each message with a blocking `recv` and echoes it, as a
# Python model's process answers each `Execute`.
_ECHO = """
import socket, sys
import msgspec
from naiad.channel import Channel

class Note(msgspec.Struct, tag=True, array_like=True):
    text: str
    number: int = 0

class Stop(msgspec.Struct, tag=True, array_like=True):
    pass

channel = Channel(socket.socket(fileno=int(sys.argv[1])), msgspec.msgpack.Decoder(Note | Stop))
while not isinstance(message := channel.recv(), Stop):
    channel.send(message)
"""


def _voluntary_switches(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts context switches in /proc")
def test_a_blocked_reader_sleeps_once_per_message_not_again_when_its_answer_is_read() -> None:
    """A Unix stream socket has one wait queue for both directions: a reader blocked in recvmsg
    was also woken each time the other side read what it had written (room to write again), so
    the model process slept twice per request. It now waits for input only."""
    ours, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    channel = Channel(ours, DECODER)
    try:
        for i in range(20):  # start-up and warm-up out of the count
            channel.send(Note("warm", i))
            assert channel.recv() == Note("warm", i)
        before, rounds = _voluntary_switches(child.pid), 400
        for i in range(rounds):
            channel.send(Note("x", i))
            # Read the answer as the server's event loop does, a while after it arrived (by then
            # the echoing process is back in its read, asleep), and send the next message a
            # while later, as the next request comes (a wake-up for nothing would otherwise find
            # it there and pass for the wake-up it brings).
            select.select([ours], [], [])
            time.sleep(0.0005)
            assert channel.recv() == Note("x", i)
            time.sleep(0.0005)
        per_message = (_voluntary_switches(child.pid) - before) / rounds
        assert per_message < 1.5, f"the echoing process slept {per_message:.2f} times per message"
        channel.send(Stop())
        assert child.wait(10) == 0
    finally:
        channel.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_large_messages_arrive_whole_across_many_reads() -> None:
    sender, receiver = _pair()
    big = Note("x" * 3_000_000, 1)
    thread = threading.Thread(target=sender.send, args=(big,))
    thread.start()
    assert receiver.recv() == big
    thread.join()


def test_a_loop_reads_a_message_larger_than_its_reads_whole() -> None:
    """An event loop takes what is there on each wake-up: a message over READ_SIZE (an LLM's
    prompt logprobs) arrives over many, and the buffer grows to hold it (a full buffer once
    read nothing and took that for the end of the stream)."""
    left, right = socket.socketpair()
    sender, receiver = Channel(left, DECODER), Channel(right, DECODER)
    receiver.set_nonblocking()
    big = [Note("x" * (3 * channel.READ_SIZE), 1), Note("y" * channel.READ_SIZE, 2), Note("small", 3)]
    writer = threading.Thread(target=sender.send_many, args=(big,))
    writer.start()
    received: list[Message] = []
    deadline = time.monotonic() + 10
    while len(received) < 3 and time.monotonic() < deadline:
        select.select([right], [], [], 1)
        received += receiver.recv_ready()
    writer.join(5)
    assert received == big


def test_descriptors_travel_with_their_message() -> None:
    sender, receiver = _pair()
    fd = os.memfd_create("test")
    os.write(fd, b"shared")
    sender.send(Note("segment"), fds=(fd,))
    os.close(fd)
    assert receiver.recv() == Note("segment")
    received = receiver.take_fd()
    assert os.pread(received, 6, 0) == b"shared"
    os.close(received)


def test_a_message_that_does_not_decode_is_dropped_and_the_others_arrive() -> None:
    left, right = socket.socketpair()
    receiver = Channel(right, DECODER)
    receiver.set_nonblocking()
    good = msgspec.msgpack.encode(Note("after"))
    bad = msgspec.msgpack.encode(["NoSuchTag"])
    left.sendall(b"".join(len(frame).to_bytes(4, "little") + frame for frame in (bad, good)))
    assert receiver.recv_ready() == [Note("after")]
    left.sendall(len(good).to_bytes(4, "little") + good)
    assert receiver.recv_ready() == [Note("after")]  # the bad frame is not met again


def test_a_loop_reading_a_byte_at_a_time_gets_every_message_once_in_order() -> None:
    """Reads that end anywhere (inside a length, between frames, inside a body) leave the partial
    frame for the next read; whole ones come out once, in order."""
    left, right = socket.socketpair()
    receiver = Channel(right, DECODER)
    receiver.set_nonblocking()
    notes = [Note("a", 1), Note("", 2), Note("ccc" * 50, 3)]
    stream = b"".join(len(frame).to_bytes(4, "little") + frame for frame in map(msgspec.msgpack.encode, notes))
    received: list[Message] = []
    for offset in range(len(stream)):
        left.sendall(stream[offset : offset + 1])
        received += receiver.recv_ready()
    assert received == notes
    assert receiver.recv_ready() == []


# ------------------------------------------------------------- the end an event loop reads


class Writable:
    """A stand-in for the loop's `watch_writable`: records each watch armed and stopped; the test
    plays the loop by calling `fire()` while the socket has room."""

    def __init__(self, loop_gone: bool = False) -> None:
        self.loop_gone = loop_gone
        self.armed = 0
        self.stopped = 0
        self.callback: Callable[[], None] | None = None

    def __call__(self, fd: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        if self.loop_gone:
            return None
        self.armed += 1
        self.callback = callback

        def stop() -> None:
            self.stopped += 1
            self.callback = None

        return stop

    def fire(self) -> None:
        if self.callback is not None:
            self.callback()


def _loop_end(sock: socket.socket, writable: Writable) -> Channel[Message]:
    channel = Channel(sock, DECODER)
    channel.set_nonblocking()
    channel.never_wait(writable)
    return channel


def _receive(channel: Channel[Message], count: int, into: list[Message]) -> threading.Thread:
    """A reader thread taking `count` messages (and reading the descriptor a "segment" brings)."""

    def read() -> None:
        for _ in range(count):
            message = channel.recv()
            into.append(message)
            if isinstance(message, Note) and message.text == "segment":
                into.append(Note(os.pread(fd := channel.take_fd(), 6, 0).decode()))
                os.close(fd)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _play_the_loop_until_read(writable: Writable, reader: threading.Thread) -> None:
    deadline = time.monotonic() + 10
    while reader.is_alive() and time.monotonic() < deadline:
        writable.fire()
        time.sleep(0.001)
    assert not reader.is_alive()


def test_a_loop_end_never_waits_for_a_reader_and_sends_the_rest_in_order_when_there_is_room() -> None:
    left, right = socket.socketpair()
    writable = Writable()
    sender = _loop_end(left, writable)
    notes = [Note(f"{i}" * 100_000, i) for i in range(8)]  # 800 kB: far past the socket's buffer
    began = time.monotonic()
    for message in notes:
        sender.send(message)  # nobody reads yet: a blocking send would never return
    assert time.monotonic() - began < 1
    assert (writable.armed, writable.stopped) == (1, 0)  # one backlog, one watch for room
    writable.fire()
    assert writable.stopped == 0  # still no room: the watch stays
    received: list[Message] = []
    _play_the_loop_until_read(writable, _receive(Channel(right, DECODER), len(notes), received))
    assert received == notes
    assert (writable.armed, writable.stopped) == (1, 1)  # sent: the loop stopped watching
    sender.send(Note("after"))  # straight out again: no new backlog
    assert writable.armed == 1
    assert Channel(right, DECODER).recv() == Note("after")


def test_descriptors_wait_in_the_backlog_with_their_message() -> None:
    left, right = socket.socketpair()
    writable = Writable()
    sender = _loop_end(left, writable)
    sender.send(Note("x" * 1_000_000))  # fills the socket: the rest waits
    fd = os.memfd_create("test")
    os.write(fd, b"shared")
    sender.send(Note("segment"), fds=(fd,))  # behind it, with its descriptor
    os.close(fd)  # the backlog holds a copy
    received: list[Message] = []
    _play_the_loop_until_read(writable, _receive(Channel(right, DECODER), 2, received))
    assert received == [Note("x" * 1_000_000), Note("segment"), Note("shared")]


def test_a_closed_peer_ends_the_backlog_and_the_loop_stops_watching() -> None:
    left, right = socket.socketpair()
    writable = Writable()
    sender = _loop_end(left, writable)
    sender.send(Note("x" * 1_000_000))
    right.close()
    with pytest.raises(ChannelClosed):
        sender.send_backlog()
    writable.fire()  # the loop's call: the reader reports the end, the watch goes
    assert writable.stopped == 1


def test_without_a_loop_any_more_the_backlog_goes_out_on_the_sender() -> None:
    """A loop shutting down watches nothing: the sender waits for room itself, as a blocking end."""
    left, right = socket.socketpair()
    sender = _loop_end(left, Writable(loop_gone=True))
    received: list[Message] = []
    reader = _receive(Channel(right, DECODER), 1, received)
    sender.send(Note("x" * 1_000_000))
    reader.join(10)
    assert received == [Note("x" * 1_000_000)]


def test_close_stops_the_loops_watch_before_the_socket_goes() -> None:
    left, right = socket.socketpair()
    writable = Writable()
    sender = _loop_end(left, writable)
    sender.send(Note("x" * 1_000_000))
    assert writable.armed == 1
    sender.close()
    assert writable.stopped == 1 and left.fileno() == -1
    right.close()
