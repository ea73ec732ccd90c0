"""ModelStreamInfer with the decoupled repeat model and ordinary models: many requests in flight on
one stream, request ids, errors on the stream, `triton_grpc_error`, empty final responses
(SPEC §1.2 decoupled rules), with the sync client's stream and the aio client's stream_infer."""

from __future__ import annotations

import asyncio
import queue
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from e2e.infer_models import infer_server as infer_server  # the fixture

pytestmark = pytest.mark.e2e

MODEL = "repeat_int32"
WAIT = 30  # seconds: a bound on every wait, never reached when things work


class Stream:
    """A sync client stream whose callback answers land in a queue."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)), headers=headers)

    def send(self, values: list[int], request_id: str, delays: list[int] | None = None, model: str = MODEL,
             **kwargs: Any) -> None:
        self.client.async_stream_infer(model, _repeat_inputs(values, delays), request_id=request_id, **kwargs)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.answers.get(timeout=WAIT) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(infer_server: Any) -> Iterator[Stream]:
    opened = Stream(infer_server.grpc_url)
    yield opened
    opened.close()


def _repeat_inputs(values: list[int], delays: list[int] | None = None,
                   module: Any = grpcclient) -> list[Any]:
    tensor = module.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    if delays is None:
        return [tensor]
    delay = module.InferInput("DELAY", [len(delays)], "UINT32")
    delay.set_data_from_numpy(np.array(delays, dtype=np.uint32))
    return [tensor, delay]


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def test_many_requests_in_flight_each_with_its_id(stream: Stream) -> None:
    requests = {f"r{i}": list(range(i * 10, i * 10 + 1 + i % 4)) for i in range(20)}
    for request_id, values in requests.items():
        stream.send(values, request_id, delays=[i % 3 for i in range(len(values))])
    answers = stream.take(sum(len(v) for v in requests.values()))
    got: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for result, error in answers:
        assert error is None
        assert not _final(result)  # data responses; no empty finals unless asked for
        got[result.get_response().id].append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
    assert got == {rid: [(v, i) for i, v in enumerate(values)] for rid, values in requests.items()}
    assert stream.answers.empty()


def test_empty_final_responses_only_when_asked_for(stream: Stream) -> None:
    stream.send([5, 6], "with", enable_empty_final_response=True)
    answers = stream.take(3)
    assert [error for _, error in answers] == [None] * 3
    assert [_final(result) for result, _ in answers] == [False, False, True]
    empty = answers[2][0].get_response()
    assert (empty.id, empty.model_name, list(empty.outputs), list(empty.raw_output_contents)) == (
        "with", MODEL, [], [])
    stream.send([], "nothing", enable_empty_final_response=True)  # zero elements: only the final
    ((result, error),) = stream.take(1)
    assert error is None and _final(result) and result.get_response().id == "nothing"
    stream.send([7], "without")
    stream.send([], "silent")
    stream.send([8], "after")
    answers = stream.take(2)
    assert [r.get_response().id for r, _ in answers] == ["without", "after"]


def test_errors_arrive_on_the_stream_and_it_stays_open(stream: Stream) -> None:
    stream.send([1, 2], "bad-delay", delays=[0])
    ((result, error),) = stream.take(1)
    assert result is None and isinstance(error, InferenceServerException)
    assert error.message() == "DELAY must have as many elements as IN"
    stream.send([1], "unknown", model="nope")
    ((_, error),) = stream.take(1)
    assert error.message() == "Request for unknown model: 'nope' is not found"
    stream.send([1], "shape", model="id_fp32")
    ((_, error),) = stream.take(1)
    assert error.message() == "[request id: shape] unexpected inference input 'IN' for model 'id_fp32'"
    stream.send([3], "fine")
    ((result, error),) = stream.take(1)
    assert error is None and int(result.as_numpy("OUT")[0]) == 3 and result.get_response().id == "fine"


def test_triton_grpc_error_ends_the_stream_with_a_status(infer_server: Any) -> None:
    stream = Stream(infer_server.grpc_url, headers={"triton_grpc_error": "true"})
    try:
        stream.send([4], "ok")
        ((result, error),) = stream.take(1)
        assert error is None and result.get_response().id == "ok"
        stream.send([1, 2], "bad", delays=[0])
        ((result, error),) = stream.take(1)
        assert result is None
        assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT",
                                                     "DELAY must have as many elements as IN")
    finally:
        stream.close()


def test_ordinary_models_answer_once_with_a_final_flag(stream: Stream) -> None:
    for i in range(6):
        data = np.full((1, 3), i, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32").set_data_from_numpy(data)
        stream.client.async_stream_infer("id_fp32", [tensor], request_id=f"id{i}")
    answers = stream.take(6)
    # Non-decoupled answers keep the order of their requests, as in Triton.
    assert [r.get_response().id for r, _ in answers] == [f"id{i}" for i in range(6)]
    assert all(_final(r) for r, _ in answers)
    assert [r.as_numpy("OUTPUT0").tolist() for r, _ in answers] == [[[float(i)] * 3] for i in range(6)]


def test_aio_stream_infer(infer_server: Any) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(10):
            yield {"model_name": MODEL, "inputs": _repeat_inputs([i, i + 1], module=aioclient), "request_id": str(i)}
        data = np.ones((2, 2), np.float32)
        yield {"model_name": "id_fp32", "request_id": "plain",
               "inputs": [aioclient.InferInput("INPUT0", [2, 2], "FP32").set_data_from_numpy(data)]}
        yield {"model_name": MODEL, "inputs": _repeat_inputs([1, 2], [0], module=aioclient), "request_id": "bad"}

    async def main() -> None:
        client = aioclient.InferenceServerClient(infer_server.grpc_url)
        try:
            got: dict[str, list[Any]] = defaultdict(list)
            errors = []
            async for result, error in client.stream_infer(requests()):
                if error is not None:
                    errors.append(error.message())
                else:
                    got[result.get_response().id].append(result)
            assert errors == ["DELAY must have as many elements as IN"]
            assert {rid: [int(r.as_numpy("OUT")[0]) for r in results]
                    for rid, results in got.items() if rid != "plain"} == {str(i): [i, i + 1] for i in range(10)}
            (plain,) = got["plain"]
            assert _final(plain) and plain.as_numpy("OUTPUT0").tolist() == [[1.0, 1.0], [1.0, 1.0]]
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))
