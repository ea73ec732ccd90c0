"""ThreadedInstance: batches run one at a time on the instance's thread, or, for a short one on
an idle instance that allows it, on the thread that submits it (`execute_here`)."""

from __future__ import annotations

import threading
import time

import numpy as np

from naiad.backends.base import Batch, BatchSender, ExecutionTimes
from naiad.backends.threaded import ThreadedInstance
from naiad.types import DataType, InferRequest, Tensor


class _Sender(BatchSender):
    def __init__(self) -> None:
        self.times: list[ExecutionTimes] = []
        self.sent: list[tuple[object, bool, threading.Thread]] = []
        self.answered = threading.Event()

    def executed(self, times: ExecutionTimes) -> None:
        self.times.append(times)

    def send(self, index: int, result, final: bool) -> None:
        self.sent.append((result["OUTPUT0"].tolist(), final, threading.current_thread()))
        self.answered.set()

    def close_open(self, error) -> None:
        pass


class _Echo(ThreadedInstance):
    runs_anywhere = True

    # Quick, for these tests, whatever the machine's speed.
    quick_ns = 10_000_000

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.running = 0
        self.most_at_once = 0
        self.go = threading.Event()
        self.go.set()

    def execute(self, batch: Batch) -> list:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.go.wait(10)
        deadline = time.thread_time() + self.delay_s
        while time.thread_time() < deadline:  # busy, as an instance that runs anywhere must be
            pass
        self.running -= 1
        return [{"OUTPUT0": r.inputs[0].data} for r in batch.requests]


def _batch(value: float = 1.0) -> tuple[Batch, _Sender]:
    data = np.full((1, 2), value, np.float32)
    return Batch([InferRequest("m", None, [Tensor("INPUT0", DataType.FP32, (1, 2), data)])], True), _Sender()


def _on_its_thread(instance: ThreadedInstance) -> _Sender:
    batch, sender = _batch()
    instance.submit(batch, sender)
    assert sender.answered.wait(10)
    deadline = time.monotonic() + 10
    while instance._executing.locked() and time.monotonic() < deadline:  # it answers, then lets go
        time.sleep(0.001)
    return sender


def test_a_quick_idle_instance_runs_a_batch_on_the_calling_thread_with_its_times():
    instance = _Echo()
    _on_its_thread(instance)  # one execution timed, on the instance's thread
    batch, sender = _batch(7.0)
    assert instance.execute_here(lambda: (batch, sender))
    assert sender.sent == [([[7.0, 7.0]], True, threading.current_thread())]
    assert len(sender.times) == 1 and sender.times[0].end_ns >= sender.times[0].start_ns
    instance.close()


def test_no_batch_runs_here_before_an_execution_was_timed_or_where_the_instance_forbids_it():
    taken: list[int] = []

    def take() -> tuple[Batch, _Sender]:
        taken.append(1)
        return _batch()

    fresh = _Echo()
    assert not fresh.execute_here(take)  # not even started: how long it takes is unknown
    pinned = _Echo()
    pinned.runs_anywhere = False  # e.g. a framework whose state belongs to the instance's thread
    _on_its_thread(pinned)
    assert not pinned.execute_here(take)
    decoupled = _Echo()
    decoupled.decoupled = True
    assert not decoupled.execute_here(take)
    assert taken == []
    for instance in (fresh, pinned, decoupled):
        instance.close()


def test_an_instance_turned_slow_runs_nothing_here_until_it_has_been_quick_again():
    instance = _Echo()
    _on_its_thread(instance)
    batch, sender = _batch()
    assert instance.execute_here(lambda: (batch, sender))
    instance.delay_s = 8 * instance.quick_ns / 1e9
    _on_its_thread(instance)  # one execution of 8x the bound lifts the recent figure past it
    assert not instance.execute_here(_batch)
    instance.delay_s = 0.0
    for _ in range(3):  # it falls by an eighth of the gap per execution: still above the bound
        _on_its_thread(instance)
    assert not instance.execute_here(_batch)
    for _ in range(20):
        _on_its_thread(instance)
    batch, sender = _batch()
    assert instance.execute_here(lambda: (batch, sender))
    instance.close()


def test_nothing_runs_here_while_the_instances_thread_executes_a_batch():
    instance = _Echo()
    _on_its_thread(instance)
    instance.go.clear()  # the next batch on the instance's thread blocks inside execute
    busy, busy_sender = _batch()
    instance.submit(busy, busy_sender)
    deadline = time.monotonic() + 10
    while instance.running == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not instance.execute_here(_batch)  # refused at once, nothing taken
    instance.go.set()
    assert busy_sender.answered.wait(10)
    assert instance.most_at_once == 1
    instance.close()


class _Pausing(_Echo):
    """Lets go of the GIL inside each execution, so that a second one could start meanwhile."""

    def execute(self, batch: Batch) -> list:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.0002)
        self.running -= 1
        return [{"OUTPUT0": r.inputs[0].data} for r in batch.requests]


def test_callers_and_the_instances_thread_never_execute_two_batches_at_once():
    instance = _Pausing()
    _on_its_thread(instance)
    answered: list[bool] = []
    lock = threading.Lock()

    def hammer() -> None:
        for i in range(200):
            batch, sender = _batch(float(i))
            if not instance.execute_here(lambda b=batch, s=sender: (b, s)):
                instance.submit(batch, sender)  # busy: its thread runs it
            ok = sender.answered.wait(10)
            with lock:
                answered.append(ok)

    callers = [threading.Thread(target=hammer) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    instance.close()
    assert len(answered) == 800 and all(answered)
    assert instance.most_at_once == 1
