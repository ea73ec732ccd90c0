"""PythonInstance's handling of its model process's messages, with the process faked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, ExecutionTimes
from naiad.backends.python import messages as p
from naiad.backends.python.backend import PythonInstance, _Pending
from naiad.types import InferRequest


class _Unstarted(PythonInstance):
    def _start(self) -> None:  # no model process: the test plays it
        pass


class _Process:
    """What the instance calls on its model process here: flush (arena: no shared memory)."""

    arena = None

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def flush(self) -> None:
        self.events.append("flush")

    def flush_frees(self) -> None:
        pass


class _Sender:
    """The scheduler's side of a batch: told when it executed (a scheduler then starts the next
    batch on the instance) and given each response."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def executed(self, times: ExecutionTimes) -> None:
        self.events.append("executed")

    def send(self, index: int, result: Any, final: bool) -> None:
        self.events.append(f"response {index}")

    def is_cancelled(self, index: int) -> bool:
        return False


def _instance(tmp_path: Path, events: list[str]) -> PythonInstance:
    config = mc.ModelConfig(name="m", output=[mc.ModelOutput(name="OUT", data_type=mc.TYPE_FP32, dims=[1])])
    instance = _Unstarted(SimpleNamespace(config=config, host=None, model_dir=tmp_path), "m_0", {}, 5.0)
    instance._process = _Process(events)
    return instance


def _sent(instance: PythonInstance, batch_id: int, events: list[str]) -> None:
    """A batch of two requests, as if submitted and sent to the model process."""
    batch = Batch([InferRequest("m", None, [], None), InferRequest("m", None, [], None)], batched=False)
    instance._pending[batch_id] = _Pending(batch_id, batch, _Sender(events))
    instance._newest = batch_id


def _executed(instance: PythonInstance, batch_id: int) -> None:
    responses = [p.Response(batch_id, index, [], error="refused", code="INVALID_ARGUMENT") for index in (0, 1)]
    instance._on_message(p.Executed(batch_id, responses, times=[1, 2, 3, 4]))


def test_an_idle_model_gets_its_next_batch_before_the_responses_are_delivered(tmp_path: Path) -> None:
    # The scheduler gives the instance its next batch when told "executed"; that batch waits in
    # the process's outbox for the end of the event loop's turn unless flushed. With nothing else
    # to execute, the model would wait for the finished batch's responses to be encoded and
    # written: the batch goes out first.
    events: list[str] = []
    instance = _instance(tmp_path, events)
    _sent(instance, 7, events)

    _executed(instance, 7)

    assert events == ["executed", "flush", "response 0", "response 1"]
    assert 7 not in instance._pending  # answered and executed: forgotten


def test_a_busy_model_gets_its_next_batch_with_the_rest_of_the_turn(tmp_path: Path) -> None:
    # Batch 8 is still executing when 7 finishes: whatever the scheduler adds waits for the end
    # of the turn, to go out in one write with anything else sent to the process meanwhile.
    events: list[str] = []
    instance = _instance(tmp_path, events)
    _sent(instance, 7, events)
    _sent(instance, 8, events)

    _executed(instance, 7)

    assert events == ["executed", "response 0", "response 1"]
    events.clear()
    _executed(instance, 8)
    assert events == ["executed", "flush", "response 0", "response 1"]


class _SubmittingProcess(_Process):
    """... and what `submit` calls: the Execute sent at once or with the rest of the loop's turn."""

    arena = object()  # (the requests here carry no tensors: nothing is written to it)

    def take_frees(self) -> list[int]:
        return []

    def send_now(self, message: p.Execute) -> None:
        self.events.append(f"now {message.batch}")

    def send_soon(self, message: p.Execute, call_soon: Any) -> None:
        self.events.append(f"soon {message.batch}")


def test_an_idle_model_gets_a_submitted_batch_at_once(tmp_path: Path) -> None:
    # Nothing else executing (one request at a time): the batch goes out as it is submitted, and
    # the rest of the loop's turn overlaps its execution. A busy model gets the next one with
    # whatever else the turn sends it, in one write.
    events: list[str] = []
    instance = _instance(tmp_path, events)
    instance._process = _SubmittingProcess(events)  # type: ignore[assignment]

    assert instance.submit(Batch([InferRequest("m", None, [], None)], batched=False), _Sender(events))
    assert instance.submit(Batch([InferRequest("m", None, [], None)], batched=False), _Sender(events))

    assert events == ["now 1", "soon 2"]
    _executed_one(instance, 1)
    _executed_one(instance, 2)
    assert instance.submit(Batch([InferRequest("m", None, [], None)], batched=False), _Sender(events))
    assert events[-1] == "now 3"  # idle again


def _executed_one(instance: PythonInstance, batch_id: int) -> None:
    instance._on_message(p.Executed(batch_id, [p.Response(batch_id, 0, [], error="x")], times=[1, 2, 3, 4]))
