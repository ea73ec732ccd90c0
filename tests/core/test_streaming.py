"""Decoupled models through the core: InferenceServer.stream with the repeat backend."""

import asyncio

import numpy as np
import pytest
from e2e.infer_models import REPEAT_CONFIG

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.errors import Unsupported
from naiad.types import DataType, InferRequest, Tensor


@pytest.fixture
def server(tmp_path):
    (tmp_path / "repeat_int32" / "1").mkdir(parents=True)
    (tmp_path / "repeat_int32" / "config.pbtxt").write_text(REPEAT_CONFIG)
    server = InferenceServer(ServerOptions(model_repositories=(tmp_path,)))
    server.start()
    yield server
    server.stop()


def _request(values, request_id="r", delays=None):
    inputs = [Tensor("IN", DataType.INT32, (len(values),), np.array(values, dtype=np.int32))]
    if delays is not None:
        inputs.append(Tensor("DELAY", DataType.UINT32, (len(delays),), np.array(delays, dtype=np.uint32)))
    return InferRequest("repeat_int32", None, inputs, id=request_id)


async def _collect(server, request):
    return [response async for response in server.stream(request)]


def test_one_response_per_element_then_an_empty_final(server):
    responses = asyncio.run(_collect(server, _request([5, 6, 7])))
    assert [r.final for r in responses] == [False, False, False, True]
    assert [r.outputs[0].data.tolist() for r in responses[:3]] == [[5], [6], [7]]
    assert [r.outputs[1].data.tolist() for r in responses[:3]] == [[0], [1], [2]]
    assert responses[-1].outputs == [] and responses[-1].error is None
    assert all(r.id == "r" for r in responses)
    assert server.inflight == 0


def test_zero_elements_give_only_the_final_response(server):
    responses = asyncio.run(_collect(server, _request([])))
    assert len(responses) == 1 and responses[0].final and responses[0].outputs == []


def test_streams_interleave(server):
    async def both():
        return await asyncio.gather(_collect(server, _request([1, 2], "a", [20, 20])),
                                    _collect(server, _request([3], "b")))

    a, b = asyncio.run(both())
    assert [r.id for r in a] == ["a"] * 3 and [r.id for r in b] == ["b"] * 2


def test_a_per_request_error_is_a_final_error_response(server):
    responses = asyncio.run(_collect(server, _request([1, 2], delays=[0])))
    assert len(responses) == 1 and responses[0].final
    assert "DELAY must have as many elements as IN" in str(responses[0].error)


def test_unary_infer_refuses_decoupled_models(server):
    with pytest.raises(Unsupported, match="doesn't support models with decoupled transaction policy"):
        asyncio.run(server.infer(_request([1])))
    assert server.inflight == 0
    stats = server.statistics("repeat_int32", None)["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1


def _stream_soon(server, request, cancel_after=None, linger_s=0.0):
    """server.stream_soon from a task: (responses, the threads they came on, Job.cancellations
    before and after); `cancel_after` responses, cancel; then wait `linger_s` for stragglers."""
    import threading

    from naiad.scheduling.base import Job

    async def run():
        got, threads, done = [], [], asyncio.Event()

        def on_response(response):
            got.append(response)
            threads.append(threading.get_ident())
            if response.final or len(got) == cancel_after:
                done.set()

        cancel = server.stream_soon(request, on_response)
        await asyncio.wait_for(done.wait(), 10)
        before = Job.cancellations
        if cancel_after is not None or linger_s:
            cancel()
            cancel()  # twice: the in-flight count still ends once
        await asyncio.sleep(linger_s)
        return got, set(threads) - {threading.get_ident()}, before, Job.cancellations

    return asyncio.run(run())


def test_stream_soon_hands_every_response_to_the_callback_on_the_callers_thread(server):
    got, other_threads, _, _ = _stream_soon(server, _request([5, 6, 7], delays=[5, 5, 5]))
    assert [r.final for r in got] == [False, False, False, True]
    assert other_threads == set()
    assert server.inflight == 0


def test_a_cancelled_stream_hears_nothing_more_and_ends_its_inflight_once(server):
    got, _, before, after = _stream_soon(server, _request([1, 2, 3, 4], delays=[50] * 4), cancel_after=1,
                                         linger_s=0.4)
    assert len(got) == 1 and not got[0].final  # the model's later responses are dropped
    assert server.inflight == 0
    assert after == before + 1  # the job was cancelled (once)


def test_cancelling_a_finished_stream_cancels_no_job(server):
    got, _, before, after = _stream_soon(server, _request([1]), linger_s=0.01)
    assert got[-1].final and server.inflight == 0
    assert after == before  # no spurious cancellation to send the schedulers scanning


def test_a_stream_left_early_ends_its_inflight(server):
    async def first_then_leave():
        responses = server.stream(_request([1, 2, 3], delays=[50] * 3))
        first = await anext(responses)
        await responses.aclose()
        await asyncio.sleep(0.3)  # the model's last responses, dropped, come while the loop runs
        return first

    assert not asyncio.run(first_then_leave()).final
    assert server.inflight == 0
