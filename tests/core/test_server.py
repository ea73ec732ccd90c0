"""InferenceServer.infer_soon, the path of every HTTP and gRPC inference without a task: one
answer on the caller's thread, and an in-flight count that ends once, when the answer comes or
when the client goes away, whichever is first (a graceful stop waits for that count)."""

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.scheduling.base import Job
from naiad.types import DataType, InferRequest, InferResponse, Tensor

# One instance that holds each batch 300 ms: a second request queues behind the first.
SLOW = """
name: "slow"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value { string_value: "300" } }
"""


# No delay: once its executions are known to be quick, a request runs on the thread that
# submits it when the instance is idle, and is answered before `infer_soon` returns.
FAST = SLOW.replace('"slow"', '"fast"').replace('string_value: "300"', 'string_value: "0"')


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InferenceServer]:
    for name, config in (("slow", SLOW), ("fast", FAST)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config)
    server = InferenceServer(ServerOptions(model_repositories=(tmp_path,)))
    server.start()
    yield server
    server.stop()


def _request(request_id: str, model: str = "slow") -> InferRequest:
    data = np.full((1, 4), float(len(request_id)), dtype=np.float32)
    return InferRequest(model, None, [Tensor("INPUT0", DataType.FP32, (1, 4), data)], id=request_id)


class _Answers:
    """What infer_soon's callback got, per request id, and on which threads."""

    def __init__(self) -> None:
        self.got: dict[str, list[InferResponse]] = {}
        self.threads: set[int] = set()

    def to(self, request_id: str) -> Callable[[InferResponse], None]:
        def answer(response: InferResponse) -> None:
            self.got.setdefault(request_id, []).append(response)
            self.threads.add(threading.get_ident())
        return answer


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_answer_comes_once_on_the_callers_thread_and_ends_the_inflight_count(server: InferenceServer) -> None:
    answers = _Answers()

    async def run() -> tuple[int, int]:
        server.infer_soon(_request("a"), answers.to("a"))
        during = server.inflight
        await _until(lambda: "a" in answers.got)
        return during, threading.get_ident()

    during, loop_thread = asyncio.run(run())
    assert during == 1 and server.inflight == 0
    (response,) = answers.got["a"]
    assert response.error is None and response.final
    assert answers.threads == {loop_thread}


def test_a_request_cancelled_while_queued_ends_its_inflight_count_and_is_never_answered(
        server: InferenceServer) -> None:
    """The client of the queued request goes away: its job leaves the queue unanswered, so only
    the canceller can end its count (it did not: a graceful stop then waited its whole
    --exit-timeout-secs for a request nobody would answer)."""
    answers = _Answers()

    async def run() -> tuple[int, int]:
        server.infer_soon(_request("running"), answers.to("running"))
        cancel = server.infer_soon(_request("queued"), answers.to("queued"))
        await _until(lambda: server.models.get("slow", None).pending() == 1)
        cancel()
        cancel()  # twice: the count still ends once
        after_cancel = server.inflight
        await _until(lambda: "running" in answers.got)
        await asyncio.sleep(0.1)  # time for a wrong answer to the cancelled request to show
        return after_cancel, server.inflight

    after_cancel, at_end = asyncio.run(run())
    assert after_cancel == 1 and at_end == 0
    assert "queued" not in answers.got
    stats = server.statistics("slow", None)["model_stats"][0]
    assert stats["execution_count"] == 1  # the cancelled request never ran
    assert stats["inference_stats"]["fail"]["count"] == 1


def test_cancelling_an_answered_request_cancels_no_job(server: InferenceServer) -> None:
    answers = _Answers()

    async def run() -> tuple[int, int]:
        cancel = server.infer_soon(_request("a"), answers.to("a"))
        await _until(lambda: "a" in answers.got)
        before = Job.cancellations
        cancel()  # the client goes away after its answer was written
        return before, Job.cancellations

    before, after = asyncio.run(run())
    assert after == before  # no spurious cancellation to send the schedulers scanning
    assert server.inflight == 0 and len(answers.got["a"]) == 1


@pytest.mark.parametrize("model", ["slow", "fast"])
def test_an_answered_request_leaves_no_cycle_between_its_sink_and_its_job(server: InferenceServer,
                                                                          model: str) -> None:
    """The job holds the sink that answers it, and the sink holds the job (to cancel it): once
    the request is done the sink lets go, so the request's objects go with their last reference.
    (With the cycle, they waited for the cyclic collector: 2026-12-05's cycle per HTTP inference
    cost 12-18 % of throughput, docs/benchmarks.md.) "fast" answers most of its requests before
    `infer_soon` returns (executed on the caller's thread)."""
    answers = _Answers()

    async def run() -> list[Callable[[], None]]:
        cancels = []
        for index in range(10):
            cancels.append(server.infer_soon(_request(f"r{index}", model), answers.to(f"r{index}")))
            await _until(lambda: f"r{index}" in answers.got)  # noqa: B023 - awaited within the iteration
        return cancels

    sinks = [cancel.__self__ for cancel in asyncio.run(run())]  # type: ignore[attr-defined]
    assert all(sink.job is None and not sink.open for sink in sinks)
