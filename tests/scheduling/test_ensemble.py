"""EnsembleRun with a scripted `submit`: which steps start when, what the ensemble answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from naiad.errors import InvalidArgument, NotFound
from naiad.scheduling.ensemble import EnsemblePlan, EnsembleRun, Step
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor


def _tensor(name: str, value: float) -> Tensor:
    data = np.array([value], dtype=np.float32)
    return Tensor(name, DataType.FP32, (1,), data)


class Steps:
    """A fake server: records each step request and lets the test answer it later."""

    def __init__(self) -> None:
        self.started: list[tuple[InferRequest, Callable[[InferResponse], None]]] = []
        self.cancelled: list[str] = []
        self.refuse: set[str] = set()

    def submit(self, request: InferRequest, sink: Callable[[InferResponse], None]) -> Callable[[], None]:
        if request.model_name in self.refuse:
            raise NotFound(f"Request for unknown model: '{request.model_name}' is not found")
        self.started.append((request, sink))
        return lambda: self.cancelled.append(request.model_name)

    def models(self) -> list[str]:
        return [request.model_name for request, _ in self.started]

    def answer(self, model: str, final: bool = True, error: Exception | None = None, scale: float = 1.0) -> None:
        """Answer the oldest unanswered request to `model`: each output = scale * sum of inputs."""
        for index, (request, sink) in enumerate(self.started):
            if request.model_name == model:
                if final:
                    del self.started[index]
                total = sum(float(t.data.sum()) for t in request.inputs)
                outputs = [] if error else [_tensor(o.name, scale * total) for o in request.outputs or []]
                sink(InferResponse(model, "1", request.id, outputs, error=error, final=final))
                return
        raise AssertionError(f"no request to {model}")


class Answers:
    def __init__(self) -> None:
        self.got: list[tuple[Any, bool]] = []

    def __call__(self, result: Any, final: bool) -> None:
        assert not (self.got and self.got[-1][1]), "an answer after the final one"
        self.got.append((result, final))


def _plan(max_inflight: int = 0) -> EnsemblePlan:
    # X → a → P; X → b → Q; (P, Q) → c → R. S comes from d, which needs nothing but X.
    steps = [
        Step(0, "a", None, (("IN", "X"),), (("OUT", "P"),)),
        Step(1, "b", 2, (("IN", "X"),), (("OUT", "Q"),)),
        Step(2, "c", None, (("L", "P"), ("R", "Q")), (("OUT", "R"),)),
        Step(3, "d", None, (("IN", "X"), ("OPT", "Y")), (("OUT", "S"),)),
    ]
    return EnsemblePlan("e", steps, ["X", "Y"], ["R", "P", "S"], max_inflight)


def _run(plan: EnsemblePlan, steps: Steps, answers: Answers, outputs: list[str] | None = None,
         **kwargs: Any) -> EnsembleRun:
    request = InferRequest("e", None, [_tensor("X", 1.0)],
                           [RequestedOutput(n) for n in outputs] if outputs else None, "req-1")
    run = EnsembleRun(plan, request, steps.submit, answers, **kwargs)
    run.start()
    return run


def test_independent_steps_start_together_and_joins_wait_for_both() -> None:
    steps, answers = Steps(), Answers()
    _run(_plan(), steps, answers)
    assert sorted(steps.models()) == ["a", "b", "d"]  # all that only need X, at once
    steps.answer("a")
    assert "c" not in steps.models()  # still waits for Q
    steps.answer("b", scale=2.0)
    assert steps.models()[-1] == "c"
    steps.answer("d")
    assert answers.got == []
    steps.answer("c")
    ((outputs, final),) = answers.got
    assert final and outputs["R"][0] == 3.0 and outputs["P"][0] == 1.0 and outputs["S"][0] == 1.0


def test_step_requests_carry_the_version_the_id_and_only_what_is_sent() -> None:
    steps, answers = Steps(), Answers()
    _run(_plan(), steps, answers)
    by_model = {request.model_name: request for request, _ in steps.started}
    assert by_model["b"].model_version == 2 and by_model["a"].model_version is None
    assert by_model["a"].id == "req-1"
    assert [t.name for t in by_model["d"].inputs] == ["IN"]  # the optional Y was not sent
    assert by_model["a"].inputs[0].data is not None


def test_only_needed_steps_run() -> None:
    steps, answers = Steps(), Answers()
    _run(_plan(), steps, answers, outputs=["P"])
    assert steps.models() == ["a"]
    steps.answer("a")
    assert answers.got[-1][1] and set(answers.got[-1][0]) == {"P"}


def test_a_failing_step_answers_at_once_names_the_step_and_cancels_the_others() -> None:
    steps, answers = Steps(), Answers()
    _run(_plan(), steps, answers)
    steps.answer("b", error=InvalidArgument("unexpected shape for input 'IN'"))
    ((error, final),) = answers.got
    assert final and isinstance(error, InvalidArgument)
    assert str(error) == "in ensemble 'e', step 1 (model 'b') failed: unexpected shape for input 'IN'"
    assert sorted(steps.cancelled) == ["a", "d"]
    steps.answer("a")  # a late answer changes nothing
    assert len(answers.got) == 1 and "c" not in steps.models()


def test_a_step_that_cannot_be_queued_fails_the_ensemble() -> None:
    steps, answers = Steps(), Answers()
    steps.refuse.add("d")
    _run(_plan(), steps, answers)
    ((error, final),) = answers.got
    assert final and isinstance(error, NotFound) and "step 3 (model 'd')" in str(error)


def test_max_inflight_requests_holds_steps_back() -> None:
    steps, answers = Steps(), Answers()
    _run(_plan(max_inflight=1), steps, answers)
    assert steps.models() == ["a"]
    steps.answer("a")
    assert steps.models() == ["b"]
    steps.answer("b")
    assert steps.models() == ["d"]  # c became ready after d was already waiting
    steps.answer("d")
    steps.answer("c")
    assert answers.got[-1][1]


def test_a_cancelled_request_starts_no_more_steps() -> None:
    steps, answers = Steps(), Answers()
    cancelled = [False]
    _run(_plan(), steps, answers, is_cancelled=lambda: cancelled[0])
    cancelled[0] = True
    steps.answer("a")
    steps.answer("b")
    assert "c" not in steps.models()
    assert answers.got and answers.got[-1][1] and "cancelled" in str(answers.got[-1][0])


def test_each_answer_of_a_decoupled_step_flows_on_and_the_ensemble_answers_per_branch() -> None:
    plan = EnsemblePlan("e", [
        Step(0, "gen", None, (("IN", "X"),), (("OUT", "ONE"),)),
        Step(1, "echo", None, (("IN", "ONE"),), (("OUT", "Y"),)),
    ], ["X"], ["Y"])
    steps, answers = Steps(), Answers()
    _run(plan, steps, answers)
    steps.answer("gen", final=False, scale=1.0)
    steps.answer("gen", final=False, scale=2.0)
    assert steps.models() == ["gen", "echo", "echo"]
    steps.answer("echo")
    steps.answer("echo")
    assert [final for _, final in answers.got] == [False]  # the last answer waits for the end
    sink = steps.started[0][1]
    del steps.started[0]
    sink(InferResponse("gen", "1", "req-1", final=True))  # flags-only final of the decoupled step
    values = [outputs["Y"][0] for outputs, _ in answers.got]
    assert sorted(values) == [1.0, 2.0] and answers.got[-1][1]


def test_a_run_whose_steps_write_nothing_fails() -> None:
    plan = EnsemblePlan("e", [Step(0, "gen", None, (("IN", "X"),), (("OUT", "Y"),))], ["X"], ["Y"])
    steps, answers = Steps(), Answers()
    _run(plan, steps, answers)
    sink = steps.started[0][1]
    sink(InferResponse("gen", "1", "req-1", final=True))
    ((error, final),) = answers.got
    assert final and "no step produced output(s) Y" in str(error)


@pytest.mark.parametrize(("wanted", "steps"), [(["R"], ["a", "b", "c"]), (["S"], ["d"]), (["P", "S"], ["a", "d"])])
def test_plan_needed_steps(wanted: list[str], steps: list[str]) -> None:
    assert [s.model_name for s in _plan().needed(frozenset(wanted))] == steps
