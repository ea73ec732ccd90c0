"""The servicer over a real in-process grpc.aio server and tritonclient.grpc.aio, with a scripted
stand-in for the core: header forwarding, stream ordering and errors, compression, refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from conftest import free_port
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from naiad.config.options import GrpcOptions
from naiad.errors import InvalidArgument, NotFound, Unsupported
from naiad.frontends.grpc.service import GrpcInferenceService
from naiad.frontends.grpc.wire.router import routes
from naiad.frontends.grpc.wire.server import WireServer
from naiad.observability.tracing import Tracer
from naiad.types import DataType, InferRequest, InferResponse, Tensor

# A request with the parameter `after: <id>` answers only once request <id> has been answered:
# it can finish only if the two are served at the same time, which a test can then assert on
# without timing anything.
AFTER = "after"
AFTER_LIMIT_S = 10


class _FakeJob:
    """A request as ScriptedServer.infer_soon keeps it; its `cancel` is what infer_soon returns."""

    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedServer:
    """Answers like InferenceServer: OUT = IN after `delay` ms (the first element of IN);
    models named `dec*` are decoupled and answer once per element, then an empty final."""

    def __init__(self) -> None:
        self.requests: list[InferRequest] = []
        self.tracer = Tracer()  # tracing off, as by default
        self.answered: dict[str, asyncio.Event] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # infer_soon's, kept referenced until done

    def _answered(self, request_id: str) -> asyncio.Event:
        return self.answered.setdefault(request_id, asyncio.Event())

    def is_decoupled(self, name: str, version: int | None) -> bool:
        if name == "nope":
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return name.startswith("dec")

    async def infer(self, request: InferRequest, decoupled_error: str) -> InferResponse:
        if self.is_decoupled(request.model_name, request.model_version):
            raise Unsupported(decoupled_error)
        async for response in self.stream(request):
            return response
        raise AssertionError("no response")

    def infer_soon(self, request: InferRequest, answer: Callable[[InferResponse], None],
                   decoupled_error: str) -> Callable[[], None]:
        """`infer` answering through `answer` on the loop, as InferenceServer.infer_soon."""
        if self.is_decoupled(request.model_name, request.model_version):
            raise Unsupported(decoupled_error)
        job = _FakeJob()

        async def run() -> None:
            async for response in self.stream(request):
                if not job.cancelled:
                    answer(response)
                return

        self.tasks.add(task := asyncio.get_running_loop().create_task(run()))
        task.add_done_callback(self.tasks.discard)
        return job.cancel

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        self.requests.append(request)
        try:
            async for response in self._answers(request):
                yield response
        finally:
            self._answered(request.id).set()

    async def _answers(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if AFTER in request.parameters:
            other = str(request.parameters[AFTER])
            try:
                await asyncio.wait_for(self._answered(other).wait(), AFTER_LIMIT_S)
            except TimeoutError:
                yield InferResponse(request.model_name, "1", request.id,
                                    error=InvalidArgument(f"{request.id}: '{other}' was never answered meanwhile"))
                return
        values = request.inputs[0].data.reshape(-1)
        if values.size and values[0] < 0:
            yield InferResponse(request.model_name, "1", request.id, error=InvalidArgument(f"bad {request.id}"))
            return
        if not self.is_decoupled(request.model_name, request.model_version):
            await asyncio.sleep(float(values[0]) / 1000 if values.size else 0)
            yield _response(request, values, True)
            return
        for value in values:
            await asyncio.sleep(float(value) / 1000)
            yield _response(request, np.array([value], np.int32), False)
        yield InferResponse(request.model_name, "1", request.id)  # empty final


def _response(request: InferRequest, values: np.ndarray, final: bool) -> InferResponse:
    tensor = Tensor("OUT", DataType.INT32, values.shape, values.astype(np.int32))
    return InferResponse(request.model_name, "1", request.id, [tensor], final=final)


Body = Callable[[aioclient.InferenceServerClient, ScriptedServer], Awaitable[None]]


@pytest.fixture(params=["naiad", "grpcio"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every test runs on both transports: naiad's own HTTP/2 and grpcio's asyncio server."""
    return str(request.param)


async def _start(transport: str, service: GrpcInferenceService) -> tuple[int, Callable[[], Awaitable[None]]]:
    port = free_port()
    if transport == "grpcio":
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        return port, lambda: server.stop(0)
    table = routes([(service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], service)])
    wire = WireServer(table, GrpcOptions(), None)
    await wire.start("127.0.0.1", port)
    return port, lambda: wire.stop(0)


def _serve(transport: str, body: Body, **service_args: Any) -> None:
    async def main() -> None:
        fake = ScriptedServer()
        port, stop = await _start(transport, GrpcInferenceService(fake, **service_args))  # type: ignore[arg-type]
        client = aioclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            await asyncio.wait_for(body(client, fake), timeout=30)
        finally:
            await client.close()
            await stop()

    asyncio.run(main())


def _inputs(*values: int) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return [tensor]


async def _requests(*items: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


def test_matching_metadata_is_forwarded_as_string_parameters(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        await client.infer("m", _inputs(1), headers={"x-tenant": "blue", "x-other": "no", "x-trace-id": "7"})
        assert fake.requests[-1].parameters == {"x-tenant": "blue", "x-trace-id": "7"}

    _serve(transport, body, forward_pattern="^X-(TENANT|TRACE)")  # case-insensitive, as HTTP


def test_nothing_is_forwarded_without_a_pattern(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        await client.infer("m", _inputs(1), headers={"x-tenant": "blue"})
        assert fake.requests[-1].parameters == {}

    _serve(transport, body)


def test_unary_infer_maps_errors_and_refuses_decoupled_models(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("dec", _inputs(1))
        assert (caught.value.status(), caught.value.message()) == (
            "StatusCode.UNIMPLEMENTED", "ModelInfer RPC doesn't support models with decoupled transaction policy")
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("m", _inputs(-1), request_id="r1")
        assert (caught.value.status(), caught.value.message()) == ("StatusCode.INVALID_ARGUMENT", "bad r1")

    _serve(transport, body)


def test_stream_answers_non_decoupled_requests_in_arrival_order(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        # The first request is answered only after the last: all three run at once (one after
        # the other, "0" would wait for "2" in vain), and the answers keep their order.
        items = [{"model_name": "m", "inputs": _inputs(1), "request_id": "0", "parameters": {AFTER: "2"}},
                 {"model_name": "m", "inputs": _inputs(1), "request_id": "1"},
                 {"model_name": "m", "inputs": _inputs(1), "request_id": "2"}]
        answers = [(result, error) async for result, error in client.stream_infer(_requests(*items))]
        assert [error for _, error in answers] == [None] * 3
        assert [r.get_response().id for r, _ in answers] == ["0", "1", "2"]
        assert all(r.get_response().parameters["triton_final_response"].bool_param for r, _ in answers)

    _serve(transport, body)


def test_stream_decoupled_responses_come_as_they_are_ready(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        # "slow" answers only once "fast" has been answered in full: served one after the other,
        # "slow" would wait for "fast" in vain.
        items = [{"model_name": "dec", "inputs": _inputs(200, 200), "request_id": "slow",
                  "parameters": {AFTER: "fast"}},
                 {"model_name": "dec", "inputs": _inputs(1, 1, 1), "request_id": "fast"}]
        answers = [result async for result, _ in client.stream_infer(_requests(*items))]
        ids = [r.get_response().id for r in answers]
        assert ids == ["fast"] * 3 + ["slow"] * 2  # no empty finals: nobody asked for them
        assert [r.get_response().parameters["triton_final_response"].bool_param for r in answers] == [False] * 5
        assert [int(r.as_numpy("OUT")[0]) for r in answers] == [1, 1, 1, 200, 200]

    _serve(transport, body)


def test_stream_errors_are_messages_and_the_stream_goes_on(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        items = [{"model_name": "m", "inputs": _inputs(-1), "request_id": "a"},
                 {"model_name": "nope", "inputs": _inputs(1), "request_id": "b", "model_version": "x"},
                 {"model_name": "m", "inputs": _inputs(2), "request_id": "c"}]
        answers = [answer async for answer in client.stream_infer(_requests(*items))]
        assert [(r is None, e.message() if e else None) for r, e in answers] == [
            (True, "bad a"),
            (True, "failed to get model version from specified version string 'x' (details: stol), version should "
                   "be an integral value > 0"),
            (False, None)]
        assert answers[2][0].get_response().id == "c"

    _serve(transport, body)


def test_triton_grpc_error_ends_the_stream_with_the_status(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        items = [{"model_name": "m", "inputs": _inputs(1), "request_id": "ok"},
                 {"model_name": "m", "inputs": _inputs(-1), "request_id": "bad"}]
        answers = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for answer in client.stream_infer(_requests(*items), headers={"triton_grpc_error": "true"}):
                answers.append(answer)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad bad")
        assert [r.get_response().id for r, _ in answers] == ["ok"]

    _serve(transport, body)


def test_compressed_inference_responses_still_decode(transport: str) -> None:
    async def body(client: aioclient.InferenceServerClient, fake: ScriptedServer) -> None:
        result = await client.infer("m", _inputs(*range(100)))
        assert result.as_numpy("OUT").tolist() == list(range(100))
        answers = [r async for r, _ in client.stream_infer(_requests({"model_name": "m", "inputs": _inputs(3)}))]
        assert answers[0].as_numpy("OUT").tolist() == [3]

    _serve(transport, body, compression=grpc.Compression.Gzip)
