"""AsyncRunner: instances that answer later (model processes) through the core's runner."""

from collections.abc import Callable

import numpy as np

from naiad.backends.base import Batch, ModelInstance, RequestResult, ResponseSender
from naiad.core.responses import ResponseBuilder
from naiad.core.runner import AsyncRunner
from naiad.errors import Unavailable
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import DataType, InferRequest, InferResponse, TensorSpec


class LaterInstance(ModelInstance):
    """Keeps what it was handed; the test answers for it, as a model process's reader would."""

    answers_later = True

    def __init__(self, room: int = 1, fail: Exception | None = None) -> None:
        self.room = room
        self.fail = fail
        self.taken: list[tuple[Batch, ResponseSender, Callable[[], None]]] = []

    def execute(self, batch: Batch) -> list[RequestResult]:
        raise AssertionError("the core must not call execute on an instance that answers later")

    def start(self, batch: Batch, send: ResponseSender, executed: Callable[[], None], blocking: bool = True) -> bool:
        if self.fail is not None:
            raise self.fail
        if not self.room:
            return False
        self.room -= 1
        self.taken.append((batch, send, executed))
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        pass


def _runner(instance: ModelInstance) -> tuple[AsyncRunner, ModelStatistics, list[int]]:
    stats = ModelStatistics("m", "1")
    released: list[int] = []
    builder = ResponseBuilder("m", "1", [TensorSpec("OUT", DataType.INT32, (1,))], False, {})
    return AsyncRunner(instance, builder, stats, False, released.append), stats, released


def _jobs(count: int, answers: list[InferResponse]) -> list[Job]:
    return [Job(InferRequest("m", None, [], id=str(i)), answers.append) for i in range(count)]


def test_the_runner_returns_before_the_answers_which_come_from_the_instance() -> None:
    instance = LaterInstance()
    runner, stats, released = _runner(instance)
    answers: list[InferResponse] = []
    assert runner.try_run(_jobs(2, answers))
    assert answers == [] and released == []  # handed over, nothing answered yet
    (_, send, executed), = instance.taken
    send(1, {"OUT": np.array([7], dtype=np.int32)}, True)
    executed()
    send(0, Unavailable("model said no"), True)
    assert [(a.id, a.final) for a in answers] == [("1", True), ("0", True)]
    assert answers[0].outputs[0].data.tolist() == [7]
    assert str(answers[1].error) == "model said no"
    assert released == [1, 1]
    snapshot = stats.as_dict()
    assert snapshot["execution_count"] == 1 and snapshot["inference_count"] == 2
    assert snapshot["inference_stats"]["success"]["count"] == 1
    assert snapshot["inference_stats"]["fail"]["count"] == 1


def test_no_room_means_nothing_was_taken() -> None:
    instance = LaterInstance(room=0)
    runner, _, released = _runner(instance)
    answers: list[InferResponse] = []
    assert not runner.try_run(_jobs(1, answers))
    assert answers == [] and released == []


def test_an_instance_that_cannot_take_the_batch_fails_each_request() -> None:
    runner, _, released = _runner(LaterInstance(fail=Unavailable("Stub process 'm_0' is not healthy.")))
    answers: list[InferResponse] = []
    runner(_jobs(2, answers))
    assert [str(a.error) for a in answers] == ["Stub process 'm_0' is not healthy."] * 2
    assert released == [1, 1]


def test_the_first_response_of_each_request_feeds_the_histogram_once(monkeypatch) -> None:
    from naiad.observability import statistics

    monkeypatch.setattr(statistics, "latency_settings", statistics.LatencySettings(histogram=True))
    instance = LaterInstance()
    runner, stats, _ = _runner(instance)
    answers: list[InferResponse] = []
    assert runner.try_run(_jobs(2, answers))
    (_, send, executed), = instance.taken
    executed()
    send(0, {"OUT": np.array([1], dtype=np.int32)}, False)  # a decoupled stream: three responses
    send(0, {"OUT": np.array([2], dtype=np.int32)}, False)
    send(0, None, True)
    send(1, Unavailable("no"), True)  # an error is a response too
    buckets, count, _ = stats.histogram_rows()
    assert count == 2 and buckets[-1] == ("+Inf", 2)
    assert stats.first_response is not None
    assert stats.failures["BACKEND"] == 1


def test_a_traced_request_answered_later_gets_its_compute_stamps_at_the_final_response() -> None:
    from naiad.observability.tracing import Trace

    instance = LaterInstance()
    runner, _, _ = _runner(instance)
    answers: list[InferResponse] = []
    jobs = _jobs(2, answers)
    jobs[0].trace = Trace(1, "m", 1, "0")
    assert runner.try_run(jobs)
    (_, send, executed), = instance.taken
    executed()
    send(0, {"OUT": np.array([1], dtype=np.int32)}, False)
    assert jobs[0].trace.timestamps == []  # not final yet
    send(0, None, True)
    send(1, None, True)
    names = [name for name, _ in jobs[0].trace.timestamps]
    assert names == ["COMPUTE_START", "COMPUTE_END"]
    assert jobs[0].trace.timestamps[0][1] <= jobs[0].trace.timestamps[1][1]
