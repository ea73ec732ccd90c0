"""A Python model's messages on the channel (its transport: tests/test_channel.py), BYTES tensors,
and small tensors carried inline."""

from __future__ import annotations

import os
import socket

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
    sender.send(p.MetricValue(4, 5))  # of the union's part defined after the channel
    first, second, third = receiver.recv(), receiver.recv(), receiver.recv()
    assert first == p.Execute(3, [request], [0, 128])
    assert second == p.Log(0, "hello", "model.py", 12)
    assert third == p.MetricValue(4, 5)
    sender.close()
    with pytest.raises(p.ChannelClosed):
        receiver.recv()
    receiver.close()


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
