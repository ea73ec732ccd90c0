"""Control messages over the socket pair: framing, descriptors, BYTES tensors."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.python import messages as p
from naiad.backends.python.shm import Arena, PendingFrees, SegmentMap


def test_messages_round_trip_in_order() -> None:
    left, right = socket.socketpair()
    sender, receiver = p.Channel(left), p.Channel(right)
    request = p.Request("id-1", 7, 1, 0, "{}", ["OUT"], [p.TensorRef("IN", "FP32", [2, 2], 0, 64, 16)])
    sender.send(p.Execute(3, [request], [0, 128]))
    sender.send(p.Log(0, "hello", "model.py", 12))
    first, second = receiver.recv(), receiver.recv()
    assert first == p.Execute(3, [request], [0, 128])
    assert second == p.Log(0, "hello", "model.py", 12)
    sender.close()
    with pytest.raises(p.ChannelClosed):
        receiver.recv()
    receiver.close()


# A model process in miniature: reads each message with a blocking `Channel.recv` and echoes it on
# the same socket, as the stub answers each `Execute`.
_ECHO = """
import socket, sys
from naiad.backends.python import messages as p
channel = p.Channel(socket.socket(fileno=int(sys.argv[1])))
while not isinstance(message := channel.recv(), p.Shutdown):
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
    channel = p.Channel(ours)
    try:
        for i in range(20):  # start-up and warm-up out of the count
            channel.send(p.Frees([i]))
            assert channel.recv() == p.Frees([i])
        before, rounds = _voluntary_switches(child.pid), 400
        for i in range(rounds):
            channel.send(p.Frees([i]))
            # Read the answer as the server's event loop does, a while after it arrived (by then
            # the echoing process is back in its read, asleep), and send the next message a
            # while later, as the next request comes (a wake-up for nothing would otherwise find
            # it there and pass for the wake-up it brings).
            select.select([ours], [], [])
            time.sleep(0.0005)
            assert channel.recv() == p.Frees([i])
            time.sleep(0.0005)
        per_message = (_voluntary_switches(child.pid) - before) / rounds
        assert per_message < 1.5, f"the echoing process slept {per_message:.2f} times per message"
        channel.send(p.Shutdown())
        assert child.wait(10) == 0
    finally:
        channel.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_large_messages_arrive_whole_across_many_reads() -> None:
    left, right = socket.socketpair()
    sender, receiver = p.Channel(left), p.Channel(right)
    big = p.Log(0, "x" * 3_000_000, "f", 1)
    thread = threading.Thread(target=sender.send, args=(big,))
    thread.start()
    assert receiver.recv() == big
    thread.join()


def test_descriptors_travel_with_their_segment_message() -> None:
    left, right = socket.socketpair()
    sender, receiver = p.Channel(left), p.Channel(right)
    fd = os.memfd_create("test")
    os.write(fd, b"shared")
    sender.send(p.Segment(0, 6), fds=(fd,))
    os.close(fd)
    message = receiver.recv()
    assert message == p.Segment(0, 6)
    received = receiver.take_fd()
    assert os.pread(received, 6, 0) == b"shared"
    os.close(received)


def _loop_end(sock: socket.socket) -> tuple[p.Channel, list[int]]:
    """A channel as the server's event loop holds it: non-blocking, never waiting to send;
    the list counts the backlogs it started."""
    channel = p.Channel(sock)
    channel.set_nonblocking()
    channel.wait_when_full(False)
    started: list[int] = []
    channel.on_backlog = lambda: started.append(1)
    return channel, started


def _receive(channel: p.Channel, count: int, into: list[p.Message]) -> threading.Thread:
    """A reader thread taking `count` messages (and the descriptors that come with them)."""

    def read() -> None:
        for _ in range(count):
            message = channel.recv()
            into.append(message)
            if isinstance(message, p.Segment):
                into.append(p.Log(0, os.pread(fd := channel.take_fd(), 6, 0).decode(), "fd", fd))
                os.close(fd)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _send_backlog_until_read(sender: p.Channel, reader: threading.Thread) -> None:
    """What the event loop does when the socket has room, until the reader has everything."""
    deadline = time.monotonic() + 10
    while reader.is_alive() and time.monotonic() < deadline:
        sender.send_backlog()
        time.sleep(0.001)
    assert not reader.is_alive()


def test_a_loop_end_never_waits_for_a_reader_and_keeps_what_it_could_not_send_in_order() -> None:
    left, right = socket.socketpair()
    sender, started = _loop_end(left)
    logs = [p.Log(0, f"{i}" * 100_000, "f", i) for i in range(8)]  # 800 kB: far past the socket's buffer
    began = time.monotonic()
    for message in logs:
        sender.send(message)  # nobody reads yet: a blocking send would never return
    assert time.monotonic() - began < 1
    assert started == [1]  # one backlog, started once
    assert not sender.send_backlog()  # still no room
    received: list[p.Message] = []
    _send_backlog_until_read(sender, _receive(p.Channel(right), len(logs), received))
    assert received == logs
    assert sender.send_backlog()  # empty now
    sender.send(p.Log(0, "after", "f", 9))  # straight out again: no new backlog
    assert started == [1]
    assert p.Channel(right).recv() == p.Log(0, "after", "f", 9)


def test_descriptors_wait_in_the_backlog_with_their_message() -> None:
    left, right = socket.socketpair()
    sender, started = _loop_end(left)
    sender.send(p.Log(0, "x" * 1_000_000, "f", 1))  # fills the socket: the rest waits
    fd = os.memfd_create("test")
    os.write(fd, b"shared")
    sender.send(p.Segment(0, 6), fds=(fd,))  # behind it, with its descriptor
    os.close(fd)
    assert started == [1]
    received: list[p.Message] = []
    _send_backlog_until_read(sender, _receive(p.Channel(right), 2, received))
    assert received[0] == p.Log(0, "x" * 1_000_000, "f", 1)
    assert received[1] == p.Segment(0, 6)
    assert isinstance(received[2], p.Log) and received[2].message == "shared"


def test_a_closed_peer_fails_the_backlog_as_a_closed_channel() -> None:
    left, right = socket.socketpair()
    sender, _ = _loop_end(left)
    sender.send(p.Log(0, "x" * 1_000_000, "f", 1))
    right.close()
    with pytest.raises(p.ChannelClosed):
        sender.send_backlog()


def test_bytes_tensors_round_trip() -> None:
    values = np.array([[b"", "héllo".encode()], [b"\x00\xff", b"x" * 1000]], dtype=object)
    restored = p.deserialize_bytes(p.serialize_bytes(values), values.shape)
    assert restored.shape == (2, 2)
    assert restored.tolist() == values.tolist()
    assert p.deserialize_bytes(p.serialize_bytes(np.array(["ab"], dtype=object)), (1,)).tolist() == [b"ab"]


def _carried(ref: p.TensorRef) -> p.TensorRef:
    """`ref` as the other side decodes it."""
    left, right = socket.socketpair()
    sender, receiver = p.Channel(left), p.Channel(right)
    sender.send(p.Execute(1, [p.Request("r", 0, 0, 0, "{}", [], [ref])]))
    (carried,) = receiver.recv().requests[0].inputs
    sender.close()
    receiver.close()
    return carried


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2],  # not contiguous
    np.zeros((0, 16), np.float32),
    np.array([b"a", b"", b"xyz"], dtype=object),
], ids=["fp32", "strided", "empty", "bytes"])
def test_small_tensors_travel_in_the_message_and_arrive_writable(array: np.ndarray) -> None:
    arena = Arena("test", lambda segment, fd, size: None)
    datatype = "BYTES" if array.dtype == object else {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
    ref = p.tensor_ref(arena, "IN", datatype, array, p.InlineRoom())
    array_before = array.copy()
    if datatype != "BYTES":
        array[...] = 7  # the sender changes its array afterwards: the message holds a copy
    got = p.tensor_array(SegmentMap(PendingFrees()), _carried(ref), array.dtype)
    assert ref.segment == p.INLINE and arena.in_use() == 0
    assert got.shape == array_before.shape and got.tolist() == array_before.tolist()
    if datatype != "BYTES":
        assert got.flags.writeable  # as a view of shared memory is: models may work in place


def test_tensors_over_the_inline_limit_go_through_the_arena() -> None:
    arena = Arena("test", lambda segment, fd, size: None)
    array = np.arange(p.INLINE_MAX // 4 + 1, dtype=np.float32)
    ref = p.tensor_ref(arena, "IN", "FP32", array, p.InlineRoom())
    assert ref.segment >= 0 and ref.nbytes == array.nbytes and not ref.data
    assert arena.in_use() == 1


def test_one_message_carries_at_most_its_inline_room_and_the_rest_goes_through_the_arena() -> None:
    """A batch of many small tensors must not make one message that outgrows the socket's buffer
    (the server's event loop would wait on a busy model process to read it)."""
    arena = Arena("test", lambda segment, fd, size: None)
    room = p.InlineRoom()
    row = np.zeros(p.INLINE_MAX // 4, np.float32)  # INLINE_MAX bytes each
    refs = [p.tensor_ref(arena, f"IN{i}", "FP32", row, room) for i in range(p.MESSAGE_INLINE_MAX // p.INLINE_MAX + 2)]
    inline = [ref for ref in refs if ref.segment == p.INLINE]
    assert sum(ref.nbytes for ref in inline) == p.MESSAGE_INLINE_MAX and len(inline) == len(refs) - 2
    assert arena.in_use() == 2
    left, right = socket.socketpair()
    with left, right:  # two messages in flight fit the buffer a model process's socket has
        assert left.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) > 2 * p.MESSAGE_INLINE_MAX
