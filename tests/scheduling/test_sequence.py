"""The sequence batcher with a fake accumulator instance: what each batch held, in which order,
which control and state values the model saw, and what reached each client."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from naiad.errors import InvalidArgument
from naiad.scheduling.base import Job
from naiad.scheduling.sequence import Control, SequenceBatcher, SequenceSettings, State
from naiad.scheduling.timers import Timers
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor
from scheduling.workers import threads

MS = 1_000_000
CONTROLS = (
    Control("START", "START", DataType.INT32, (0, 1)),
    Control("END", "END", DataType.FP32, (0.0, 1.0)),
    Control("READY", "READY", DataType.BOOL, (False, True)),
    Control("CORRID", "CORRID", DataType.UINT64),
)
STATE = State("STATE_IN", "STATE_OUT", DataType.INT32, np.zeros((1, 1), dtype=np.int32))


class Accumulator:
    """A runner: OUTPUT = STATE_IN + INPUT (fresh on START), STATE_OUT the same; records every
    batch as the model saw it. `hold()` keeps it busy until `release()`."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.busy = threading.Event()
        self.done = threading.Condition()

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def __call__(self, jobs: list[Job]) -> None:
        self.busy.set()
        self.gate.wait(10)
        seen = []
        responses = []
        for job in jobs:
            inputs = {t.name: t.data for t in job.request.inputs}
            seen.append({"id": job.request.id, **{k: v.copy() for k, v in inputs.items()}})
            total = (inputs["STATE_IN"] + inputs["INPUT"]).astype(np.int32)
            arrays = {"OUTPUT": total, "STATE_OUT": total}
            outputs = [Tensor(o.name, DataType.INT32, arrays[o.name].shape, arrays[o.name])
                       for o in job.request.outputs]
            responses.append(InferResponse("m", "1", job.request.id, outputs))
        with self.done:
            self.batches.append(seen)
            self.done.notify_all()
        for job, response in zip(jobs, responses, strict=True):
            job.sink(response)

    def wait_batches(self, count: int) -> list[list[dict[str, Any]]]:
        with self.done:
            assert self.done.wait_for(lambda: len(self.batches) >= count, 10), self.batches
        return self.batches

    def ids(self) -> list[list[str]]:
        return [[seen["id"] for seen in batch] for batch in self.batches]


class Client:
    """Collects the responses of the jobs it makes."""

    def __init__(self) -> None:
        self.responses: dict[str, InferResponse] = {}
        self.answered = threading.Condition()

    def job(self, name: str, sequence: Any, value: int = 1, start: bool = False, end: bool = False,
            rows: int = 1, outputs: list[str] | None = None) -> Job:
        parameters: dict[str, Any] = {"sequence_id": sequence}
        if start:
            parameters["sequence_start"] = True
        if end:
            parameters["sequence_end"] = True
        data = np.full((rows, 1), value, dtype=np.int32)
        requested = None if outputs is None else [RequestedOutput(n) for n in outputs]
        request = InferRequest("m", None, [Tensor("INPUT", DataType.INT32, data.shape, data)], requested,
                               id=name, parameters=parameters)
        job = Job(request, self._sink)
        job.batch_size, job.shape_key = rows, (("INPUT", (1,)),)
        return job

    def _sink(self, response: InferResponse) -> None:
        with self.answered:
            self.responses[response.id] = response
            self.answered.notify_all()

    def output(self, name: str) -> int:
        with self.answered:
            assert self.answered.wait_for(lambda: name in self.responses, 10), sorted(self.responses)
        response = self.responses[name]
        assert response.error is None, response.error
        return int(response.outputs[0].data.reshape(-1)[0])


def _settings(**changes: Any) -> SequenceSettings:
    values: dict[str, Any] = {"model_name": "acc", "batched": True, "max_batch_size": 2, "slots": 2,
                              "controls": CONTROLS, "states": (STATE,), "outputs": ("OUTPUT",)}
    values.update(changes)
    return SequenceSettings(**values)


@pytest.fixture
def dropped() -> list[tuple[Job, Exception | None]]:
    return []


def _batcher(runners: list[Any], dropped: list, **changes: Any) -> SequenceBatcher:
    batcher = SequenceBatcher(threads(*runners), _settings(**changes), lambda job, error: dropped.append((job, error)),
                              Timers())
    batcher.start()
    return batcher


def test_two_interleaved_sequences_share_a_batch_and_keep_their_own_state(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped)
    instance.hold()
    batcher.submit(client.job("a1", 7, 1, start=True))
    instance.busy.wait(5)  # a1 runs alone; the next two arrive while it executes
    batcher.submit(client.job("b1", 9, 100, start=True))
    batcher.submit(client.job("a2", 7, 2))
    instance.release()
    assert client.output("a1") == 1 and client.output("b1") == 100 and client.output("a2") == 3
    batcher.submit(client.job("b2", 9, 200, end=True))
    batcher.submit(client.job("a3", 7, 3, end=True))
    assert client.output("b2") == 300 and client.output("a3") == 6
    assert instance.ids()[:2] == [["a1"], ["a2", "b1"]]  # slot order: a holds slot 0, b slot 1
    batcher.stop()


def test_control_inputs_carry_triton_s_values_and_shapes(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped)
    for name, start, end in (("s", True, False), ("m", False, False), ("e", False, True)):
        batcher.submit(client.job(name, 2**64 - 5, 1, start=start, end=end))
        client.output(name)
    seen = {batch[0]["id"]: batch[0] for batch in instance.batches}
    assert [int(seen[n]["START"][0, 0]) for n in "sme"] == [1, 0, 0]
    assert [float(seen[n]["END"][0, 0]) for n in "sme"] == [0.0, 0.0, 1.0]
    assert all(seen[n]["READY"].dtype == np.bool_ and bool(seen[n]["READY"][0, 0]) for n in "sme")
    assert seen["s"]["CORRID"].dtype == np.uint64 and int(seen["s"]["CORRID"][0, 0]) == 2**64 - 5
    assert seen["s"]["START"].shape == (1, 1) and seen["s"]["START"].dtype == np.int32
    batcher.stop()


def test_string_correlation_ids_and_a_string_corrid_control(dropped: list) -> None:
    controls = (Control("CORRID", "CORRID", DataType.BYTES),)
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, controls=controls)
    batcher.submit(client.job("x1", "user-42", 5, start=True))
    batcher.submit(client.job("x2", "user-42", 6, end=True))
    assert client.output("x1") == 5 and client.output("x2") == 11
    assert instance.batches[0][0]["CORRID"].tolist() == [[b"user-42"]]
    batcher.stop()


def test_an_integer_id_in_a_string_corrid_control_of_a_non_batching_model(dropped: list) -> None:
    controls = (Control("CORRID", "CORRID", DataType.BYTES),)
    fed: list[Tensor] = []

    def record(jobs: list[Job]) -> None:  # a model without state: just look at what it is fed
        fed.extend(jobs[0].request.inputs)
        for job in jobs:
            job.sink(InferResponse("m", "1", job.request.id, []))

    client = Client()
    batcher = _batcher([record], dropped, controls=controls, batched=False, states=())
    job = client.job("n", 31, start=True, end=True)
    job.request.inputs[0] = Tensor("INPUT", DataType.INT32, (1,), np.array([1], dtype=np.int32))
    batcher.submit(job)
    with client.answered:
        assert client.answered.wait_for(lambda: "n" in client.responses, 10)
    corrid = next(t for t in fed if t.name == "CORRID")
    assert corrid.shape == (1,) and corrid.data.tolist() == [b"31"]
    batcher.stop()


def test_a_string_id_is_refused_when_the_corrid_control_is_numeric(dropped: list) -> None:
    batcher = _batcher([Accumulator()], dropped)
    with pytest.raises(InvalidArgument, match=r"string correlation ID.*TYPE_UINT64"):
        batcher.submit(Client().job("s", "abc", start=True))
    batcher.stop()


def test_requests_of_one_sequence_run_one_at_a_time_in_order(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, max_batch_size=4, slots=4)
    instance.hold()
    batcher.submit(client.job("r0", 5, 1, start=True))
    instance.busy.wait(5)
    for i in range(1, 5):
        batcher.submit(client.job(f"r{i}", 5, 1, end=i == 4))
    assert batcher.pending() == 4
    instance.release()
    assert [client.output(f"r{i}") for i in range(5)] == [1, 2, 3, 4, 5]
    assert instance.ids() == [[f"r{i}"] for i in range(5)]
    batcher.stop()


def test_sequences_wait_in_the_backlog_until_a_slot_frees(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, max_batch_size=1, slots=1)
    batcher.submit(client.job("a1", 1, 1, start=True))
    assert client.output("a1") == 1
    batcher.submit(client.job("b1", 2, 10, start=True))
    batcher.submit(client.job("b2", 2, 10))
    time.sleep(0.05)
    assert "b1" not in client.responses and batcher.pending() == 2  # slot held by sequence 1
    batcher.submit(client.job("a2", 1, 1, end=True))
    assert client.output("a2") == 2
    assert client.output("b1") == 10 and client.output("b2") == 20  # fresh state for sequence 2
    batcher.submit(client.job("b3", 2, 10, end=True))
    assert client.output("b3") == 30
    batcher.stop()


def test_a_sequence_on_each_instance_before_a_second_slot_is_used(dropped: list) -> None:
    first, second, client = Accumulator(), Accumulator(), Client()
    batcher = _batcher([first, second], dropped)
    batcher.submit(client.job("a", 1, start=True))
    batcher.submit(client.job("b", 2, start=True))
    client.output("a")
    client.output("b")
    assert first.ids() == [["a"]] and second.ids() == [["b"]]
    batcher.stop()


def test_errors_use_triton_s_messages(dropped: list) -> None:
    batcher = _batcher([Accumulator()], dropped)
    client = Client()
    with pytest.raises(InvalidArgument) as missing:
        batcher.submit(client.job("x", 0, start=True))
    assert missing.value.message == ("[request id: x] inference request to model 'acc' must specify a non-zero "
                                     "or non-empty correlation ID")
    with pytest.raises(InvalidArgument, match="non-empty correlation ID"):
        batcher.submit(client.job("y", "", start=True))
    with pytest.raises(InvalidArgument) as no_start:
        batcher.submit(client.job("", 37469245))
    assert no_start.value.message == (
        "[request id: <id_unknown>] inference request for sequence 37469245 to model 'acc' must specify "
        "the START flag on the first request of the sequence")
    with pytest.raises(InvalidArgument) as batch:
        batcher.submit(client.job("z", 3, start=True, rows=2))
    assert batch.value.message == ("[request id: z] inference request to model 'acc' must specify batch-size 1 "
                                   "due to requirements of sequence batcher")
    batcher.stop()


def test_after_end_the_id_needs_a_new_start(dropped: list) -> None:
    batcher, client = _batcher([Accumulator()], dropped), Client()
    batcher.submit(client.job("a", 4, start=True, end=True))
    client.output("a")
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        batcher.submit(client.job("b", 4))
    batcher.submit(client.job("c", 4, 9, start=True, end=True))
    assert client.output("c") == 9  # a fresh sequence, fresh state
    batcher.stop()


def test_an_idle_sequence_is_released_and_its_slot_reused(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, max_batch_size=1, slots=1, max_sequence_idle_ns=100 * MS)
    started = time.monotonic()  # sequence 1 cannot idle out before this + 100 ms
    batcher.submit(client.job("a1", 1, 1, start=True))
    client.output("a1")
    batcher.submit(client.job("b1", 2, 10, start=True))  # backlog: sequence 1 holds the only slot
    assert client.output("b1") == 10  # once sequence 1 idled out
    assert time.monotonic() - started >= 0.1
    with pytest.raises(InvalidArgument, match="sequence 1 to model 'acc' must specify the START flag"):
        batcher.submit(client.job("a2", 1, 1))
    batcher.stop()


def test_state_outputs_reach_the_client_only_when_declared_and_asked_for(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped)
    batcher.submit(client.job("hidden", 1, 3, start=True))
    client.output("hidden")
    assert [t.name for t in client.responses["hidden"].outputs] == ["OUTPUT"]
    batcher.stop()
    declared = _batcher([instance], dropped, outputs=("OUTPUT", "STATE_OUT"))
    declared.submit(client.job("all", 2, 3, start=True))
    declared.submit(client.job("named", 2, 4, outputs=["STATE_OUT"]))
    client.output("all")
    assert [t.name for t in client.responses["all"].outputs] == ["OUTPUT", "STATE_OUT"]
    assert client.output("named") == 7 and [t.name for t in client.responses["named"].outputs] == ["STATE_OUT"]
    declared.stop()


def test_initial_state_is_fed_on_start(dropped: list) -> None:
    initial = State("STATE_IN", "STATE_OUT", DataType.INT32, np.full((1, 1), 1000, dtype=np.int32))
    batcher, client = _batcher([Accumulator()], dropped, states=(initial,)), Client()
    batcher.submit(client.job("a", 1, 5, start=True))
    batcher.submit(client.job("b", 1, 5))
    batcher.submit(client.job("c", 1, 5, start=True, end=True))  # START again resets the state
    assert (client.output("a"), client.output("b"), client.output("c")) == (1005, 1010, 1005)
    batcher.stop()


def test_direct_waits_for_slot_utilization_up_to_the_queue_delay(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, max_queue_delay_ns=200 * MS, minimum_slot_utilization=1.0)
    started = time.monotonic()
    batcher.submit(client.job("lone", 1, start=True, end=True))
    client.output("lone")
    assert time.monotonic() - started >= 0.19
    instance.hold()
    batcher.submit(client.job("a", 2, start=True))
    batcher.submit(client.job("b", 3, start=True))
    instance.release()
    client.output("a")
    assert instance.ids()[1] == ["a", "b"]  # both slots ready: no wait
    batcher.stop()


def test_oldest_batches_the_oldest_candidate_sequences(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, oldest=True, max_batch_size=2, slots=4, preferred_batch_sizes=(2,))
    instance.hold()
    batcher.submit(client.job("w", 99, start=True, end=True))
    instance.busy.wait(5)  # everything below queues behind this one
    for sequence in (1, 2, 3):
        batcher.submit(client.job(f"s{sequence}a", sequence, sequence, start=True))
    batcher.submit(client.job("s1b", 1, 1))  # the same sequence never twice in a batch
    instance.release()
    assert client.output("s1b") == 2
    assert [client.output(f"s{n}a") for n in (1, 2, 3)] == [1, 2, 3]
    assert instance.ids() == [["w"], ["s1a", "s2a"], ["s3a", "s1b"]]
    assert [int(seen["CORRID"][0, 0]) for seen in instance.batches[1]] == [1, 2]
    batcher.stop()


def test_a_cancelled_request_is_dropped_and_the_sequence_goes_on(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped)
    instance.hold()
    batcher.submit(client.job("a", 1, 1, start=True))
    instance.busy.wait(5)
    gone = client.job("b", 1, 50)
    batcher.submit(gone)
    gone.cancel()
    batcher.submit(client.job("c", 1, 1, end=True))
    instance.release()
    assert client.output("c") == 2
    assert dropped == [(gone, None)]
    batcher.stop()


def test_a_backlog_sequence_past_its_timeout_is_rejected(dropped: list) -> None:
    instance, client = Accumulator(), Client()
    batcher = _batcher([instance], dropped, max_batch_size=1, slots=1)
    batcher.submit(client.job("a1", 1, start=True))
    client.output("a1")
    waiting = client.job("b1", 2, start=True)
    waiting.deadline_ns = waiting.enqueued_ns + 100 * MS  # the request's `timeout` parameter
    batcher.submit(waiting)
    patient = client.job("c1", 3, start=True)
    batcher.submit(patient)
    deadline = time.monotonic() + 5
    while not dropped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(job.request.id, str(error)) for job, error in dropped] == [
        ("b1", "timeout of the corresponding sequence has been expired")]
    with pytest.raises(InvalidArgument, match="START flag"):  # the expired sequence is forgotten
        batcher.submit(client.job("b2", 2))
    batcher.submit(client.job("a2", 1, end=True))
    assert client.output("c1") == 1  # the slot went to the sequence that did not time out
    batcher.stop()


def test_stop_waits_for_answers_from_an_instance_that_answers_later(dropped: list) -> None:
    """Like a Python model: the runner returns at once and answers from its own thread."""
    client = Client()
    running = threading.Event()

    def later(jobs: list[Job]) -> None:
        running.set()

        def answer() -> None:
            time.sleep(0.1)
            for job in jobs:
                job.sink(InferResponse("m", "1", job.request.id, []))

        threading.Thread(target=answer).start()

    batcher = _batcher([later], dropped, max_batch_size=1, slots=1, states=(), controls=())
    batcher.submit(client.job("a", 1, start=True))
    batcher.submit(client.job("b", 2, start=True))  # the backlog: sequence 1 never ends
    assert running.wait(5)  # "a" is with the instance, which will answer it later
    finished = threading.Event()
    threading.Thread(target=lambda: (batcher.stop(), finished.set())).start()
    assert finished.wait(5), "stop() hung"
    assert "a" in client.responses
    assert [(job.request.id, type(error).__name__) for job, error in dropped] == [("b", "Unavailable")]
