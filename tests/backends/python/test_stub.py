"""The model process's side, driven in-process through a socket pair as the server would."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.python import messages as p
from naiad.backends.python import pb_utils
from naiad.backends.python.shm import Arena, PendingFrees, SegmentMap
from naiad.backends.python.stub import Stub

IDENTITY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        if any(r.request_id() == "wrong-count" for r in requests):
            return []
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy())]) for r in requests]
'''


class FakeServer:
    """The server's end: writes inputs into its own arena, reads the stub's answers."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = p.Channel(sock)
        self.segments = SegmentMap(PendingFrees())
        self.arena = Arena("test-server", lambda seg, fd, size: self.channel.send(p.Segment(seg, size), fds=(fd,)))

    def execute(self, batch: int, request_ids: list[str], size: int = 4) -> None:
        requests = []
        for request_id in request_ids:
            ref = p.tensor_ref(self.arena, "IN", "INT32", np.arange(size, dtype=np.int32), p.InlineRoom())
            requests.append(p.Request(request_id, 0, 0, 0, "{}", ["OUT"], [ref]))
        self.channel.send(p.Execute(batch, requests))

    def next(self) -> p.Message:
        while True:
            message = self.channel.recv()
            if isinstance(message, p.Segment):
                self.segments.add(message.segment, self.channel.take_fd(), message.size)
                continue
            return message


@pytest.fixture
def stub(tmp_path: Path) -> tuple[Stub, FakeServer]:
    model = tmp_path / "model.py"
    model.write_text(IDENTITY)
    ours, theirs = socket.socketpair()
    stub = Stub(p.Channel(theirs))
    sys.modules["triton_python_backend_utils"] = pb_utils
    pb_utils._set_runtime(stub)
    stub.initialize(p.Init(str(model), {"model_name": "m", "model_version": "1"}, False))
    yield stub, FakeServer(ours)
    pb_utils._set_runtime(None)


def _serve(stub: Stub) -> threading.Thread:
    thread = threading.Thread(target=stub.serve, daemon=True)
    thread.start()
    return thread


def test_small_outputs_come_back_in_the_message(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    _serve(model_process)
    server.execute(1, ["a"])
    answer = server.next()
    assert isinstance(answer, p.Executed) and answer.error is None
    (response,) = answer.responses
    (out,) = response.outputs
    assert out.segment == p.INLINE
    assert p.tensor_array(server.segments, out, np.dtype(np.int32)).tolist() == [0, 1, 2, 3]
    assert model_process.arena.in_use() == 0  # nothing of the stub's arena was taken
    server.channel.send(p.Shutdown())


def test_large_outputs_come_back_through_the_arena(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    _serve(model_process)
    size = p.INLINE_MAX // 4 + 1
    server.execute(1, ["a"], size)
    answer = server.next()
    assert isinstance(answer, p.Executed) and answer.error is None
    (out,) = answer.responses[0].outputs
    assert out.segment >= 0 and out.nbytes == 4 * size
    array = p.tensor_array(server.segments, out, np.dtype(np.int32))
    assert np.array_equal(array, np.arange(size, dtype=np.int32))
    assert model_process.arena.in_use() == 1  # a view of it is alive here: the block is not back yet
    server.channel.send(p.Shutdown())


def test_the_model_reads_its_inputs_in_place(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    segment, offset, nbytes = server.arena.write(np.arange(4, dtype=np.int32))
    assert model_process._read_one()  # takes the segment's descriptor
    ref = p.TensorRef("IN", "INT32", [4], segment, offset, nbytes)
    request = model_process._to_request(1, 0, p.Request("r", 0, 0, 0, "{}", ["OUT"], [ref]))
    seen = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    # the server changes its memory and the model sees it: nothing was copied
    np.frombuffer(server.arena._segments[segment][0], np.int32, 4, offset)[:] = [9, 8, 7, 6]
    assert seen.tolist() == [9, 8, 7, 6]


def test_batches_that_arrived_together_are_answered_together(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    writes: list[list[str]] = []
    send_many = model_process.channel.send_many

    def counting(messages: list[p.Message], fds: tuple[int, ...] = ()) -> None:
        writes.append([type(m).__name__ for m in messages])
        send_many(messages, fds)

    model_process.channel.send_many = counting  # type: ignore[method-assign]
    server.execute(1, ["a"])  # both are in the socket before the model process reads anything
    server.execute(2, ["b"])
    _serve(model_process)
    first, second = server.next(), server.next()
    answers = [kinds for kinds in writes if "Executed" in kinds]
    assert answers == [["Executed", "Executed"]]  # one write carried both answers
    assert isinstance(first, p.Executed) and isinstance(second, p.Executed)
    assert [first.batch, second.batch] == [1, 2]
    server.channel.send(p.Shutdown())


def test_wrong_number_of_responses_fails_the_batch_with_triton_s_message(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    _serve(model_process)
    server.execute(1, ["wrong-count"])
    answer = server.next()
    assert isinstance(answer, p.Executed)
    assert answer.error is not None and answer.error.startswith(
        "Number of InferenceResponse objects do not match number of InferenceRequest objects.")
    server.channel.send(p.Shutdown())


def test_a_bls_call_gets_an_error_response_when_the_server_goes_away(stub: tuple[Stub, FakeServer]) -> None:
    model_process, server = stub
    _serve(model_process)
    results: list[object] = []
    request = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=["X"])
    caller = threading.Thread(target=lambda: results.append(model_process.exec(request, False)))
    caller.start()
    assert isinstance(server.next(), p.BlsCall)
    server.channel.close()  # the server dies before answering
    caller.join(10)
    (response,) = results
    assert isinstance(response, pb_utils.InferenceResponse) and response.has_error()
    assert "server closed the connection" in response.error().message()
