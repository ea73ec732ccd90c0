"""The core's side of the instance contract: InstanceWorker hands a batch to an instance and
BatchDelivery turns the instance's answers into counted responses for each job."""

from collections.abc import Callable

import numpy as np

from naiad.backends.base import Batch, BatchSender, ExecutionTimes, ModelInstance
from naiad.core.delivery import Responder
from naiad.core.responses import ResponseBuilder
from naiad.core.worker import InstanceWorker
from naiad.errors import Unavailable
from naiad.observability.statistics import LatencySettings, ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import DataType, InferRequest, InferResponse, TensorSpec


class LaterInstance(ModelInstance):
    """Keeps what it was handed; the test answers for it, as a model process's reader would."""

    def __init__(self, room: int = 1, fail: Exception | None = None) -> None:
        self.room = room
        self.fail = fail
        self.taken: list[tuple[Batch, BatchSender]] = []

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        if self.fail is not None:
            raise self.fail
        if not self.room:
            return False
        self.room -= 1
        self.taken.append((batch, sender))
        return True


def _worker(instance: ModelInstance, latency: LatencySettings | None = None,
            ) -> tuple[InstanceWorker, ModelStatistics, list[int]]:
    stats = ModelStatistics("m", "1", latency=latency or LatencySettings())
    released: list[int] = []
    builder = ResponseBuilder("m", "1", [TensorSpec("OUT", DataType.INT32, (1,))], False, {})
    return InstanceWorker(instance, Responder(builder, stats, released.append, "BACKEND"), False, None), stats, released


def _jobs(count: int, answers: list[InferResponse]) -> list[Job]:
    return [Job(InferRequest("m", None, [], id=str(i)), answers.append) for i in range(count)]


def _times(start: int = 1_000) -> ExecutionTimes:
    return ExecutionTimes(start, start + 10, start + 110, start + 120)


def _run(worker: InstanceWorker, jobs: list[Job], executed: Callable[[], None] | None = None) -> bool:
    return worker.run(jobs, executed or (lambda: None))


def test_the_worker_returns_before_the_answers_which_come_from_the_instance() -> None:
    instance = LaterInstance()
    worker, stats, released = _worker(instance)
    answers: list[InferResponse] = []
    executed: list[bool] = []
    assert _run(worker, _jobs(2, answers), lambda: executed.append(True))
    assert answers == [] and released == [] and executed == []  # handed over, nothing answered yet
    (_, sender), = instance.taken
    sender.executed(_times())
    assert executed == [True]  # the scheduler hears the instance is done with the batch
    sender.send(1, {"OUT": np.array([7], dtype=np.int32)}, True)
    sender.send(0, Unavailable("model said no"), True)
    assert [(a.id, a.final) for a in answers] == [("1", True), ("0", True)]
    assert answers[0].outputs[0].data.tolist() == [7]
    assert str(answers[1].error) == "model said no"
    assert released == [1, 1]
    snapshot = stats.as_dict()
    assert snapshot["execution_count"] == 1 and snapshot["inference_count"] == 2
    assert snapshot["inference_stats"]["success"]["count"] == 1
    assert snapshot["inference_stats"]["fail"]["count"] == 1
    # the execution's phases, as the instance measured them
    assert snapshot["batch_stats"][0]["compute_input"] == {"count": 1, "ns": 10}
    assert snapshot["batch_stats"][0]["compute_infer"] == {"count": 1, "ns": 100}
    assert snapshot["batch_stats"][0]["compute_output"] == {"count": 1, "ns": 10}
    assert snapshot["inference_stats"]["compute_input"] == {"count": 1, "ns": 10}


def test_no_room_means_nothing_was_taken() -> None:
    instance = LaterInstance(room=0)
    worker, _, released = _worker(instance)
    answers: list[InferResponse] = []
    assert not _run(worker, _jobs(1, answers))
    assert answers == [] and released == []


def test_an_instance_that_cannot_take_the_batch_fails_each_request() -> None:
    worker, _, released = _worker(LaterInstance(fail=Unavailable("Stub process 'm_0' is not healthy.")))
    answers: list[InferResponse] = []
    executed: list[bool] = []
    assert _run(worker, _jobs(2, answers), lambda: executed.append(True))
    assert [str(a.error) for a in answers] == ["Stub process 'm_0' is not healthy."] * 2
    assert released == [1, 1] and executed == [True]


def test_the_first_response_of_each_request_feeds_the_histogram_once() -> None:
    instance = LaterInstance()
    worker, stats, _ = _worker(instance, LatencySettings(histogram=True))
    answers: list[InferResponse] = []
    assert _run(worker, _jobs(2, answers))
    (_, sender), = instance.taken
    sender.executed(_times())
    sender.send(0, {"OUT": np.array([1], dtype=np.int32)}, False)  # a decoupled stream: three responses
    sender.send(0, {"OUT": np.array([2], dtype=np.int32)}, False)
    sender.send(0, None, True)
    sender.send(1, Unavailable("no"), True)  # an error is a response too
    buckets, count, _ = stats.histogram_rows()
    assert count == 2 and buckets[-1] == ("+Inf", 2)
    assert stats.first_response is not None
    assert stats.failures["BACKEND"] == 1


def test_a_response_after_the_final_one_is_refused() -> None:
    instance = LaterInstance()
    worker, _, released = _worker(instance)
    answers: list[InferResponse] = []
    assert _run(worker, _jobs(1, answers))
    (_, sender), = instance.taken
    sender.send(0, None, True)
    try:
        sender.send(0, None, True)
    except Exception as error:
        assert "after its final response" in str(error)
    else:
        raise AssertionError("a second final response was accepted")
    sender.close_open(Unavailable("gone"))  # nothing left open: nothing more sent
    assert len(answers) == 1 and released == [1]


def test_a_traced_request_gets_the_compute_stamps_the_instance_measured() -> None:
    from naiad.observability.tracing import Trace

    instance = LaterInstance()
    worker, _, _ = _worker(instance)
    answers: list[InferResponse] = []
    jobs = _jobs(2, answers)
    jobs[0].trace = Trace(1, "m", 1, "0")
    assert _run(worker, jobs)
    (_, sender), = instance.taken
    sender.executed(_times(5_000))
    sender.send(0, None, True)
    sender.send(1, None, True)
    assert jobs[0].trace.timestamps == [("COMPUTE_START", 5_000), ("COMPUTE_INPUT_END", 5_010),
                                        ("COMPUTE_OUTPUT_START", 5_110), ("COMPUTE_END", 5_120)]
    assert jobs[1].trace is None
