"""Control messages over the socket pair: framing, descriptors, BYTES tensors."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from naiad.backends.python import messages as p


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


def test_bytes_tensors_round_trip() -> None:
    values = np.array([[b"", "héllo".encode()], [b"\x00\xff", b"x" * 1000]], dtype=object)
    restored = p.deserialize_bytes(p.serialize_bytes(values), values.shape)
    assert restored.shape == (2, 2)
    assert restored.tolist() == values.tolist()
    assert p.deserialize_bytes(p.serialize_bytes(np.array(["ab"], dtype=object)), (1,)).tolist() == [b"ab"]
