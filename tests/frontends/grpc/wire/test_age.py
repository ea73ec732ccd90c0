"""--grpc-max-connection-age-ms / -grace-ms on naiad's HTTP/2 connection, driven frame by frame
(test_connection's client), and the same flags as grpcio channel options."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from frontends.grpc.wire.test_connection import ROUTES, Client, run, settle
from tritonclient.grpc import service_pb2 as pb

from naiad.cli import build_parser, options_from_args
from naiad.config.options import GrpcOptions
from naiad.frontends.grpc.grpcio_server import channel_options
from naiad.frontends.grpc.wire import age
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.router import Route

Request = pb.ModelInferRequest


def _gate_routes(gate: asyncio.Event) -> dict[bytes, Route]:
    async def held(request: Request, context: Any) -> pb.ModelInferResponse:
        await gate.wait()
        return pb.ModelInferResponse(id=request.id)

    return {**ROUTES, b"/t.S/Held": Route("Held", Request, held, False, False)}


def _goaways(client: Client) -> list[tuple[int, int, bytes]]:
    """(last stream id, error code, debug data) of each GOAWAY the server sent so far."""
    return [(int.from_bytes(frame.payload[:4], "big"), int.from_bytes(frame.payload[4:8], "big"), frame.payload[8:])
            for frame in client.connection_frames if frame.kind == f.GOAWAY]


def _pings(client: Client) -> list[bytes]:
    return [frame.payload for frame in client.connection_frames if frame.kind == f.PING and not frame.flags & f.ACK]


def test_age_is_jittered_by_ten_percent_and_zero_means_no_limit() -> None:
    rng = random.Random(7)
    ages = [age.age_seconds(GrpcOptions(max_connection_age_ms=1000), rng) for _ in range(500)]
    assert all(0.9 <= value <= 1.1 for value in ages)
    assert min(ages) < 0.95 and max(ages) > 1.05  # spread over the range, not one value
    assert age.age_seconds(GrpcOptions()) == 0.0
    assert age.grace_seconds(GrpcOptions(max_connection_age_grace_ms=250)) == 0.25


def test_an_old_connection_goes_away_in_two_steps_and_finishes_its_calls() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        client = Client(GrpcOptions(max_connection_age_ms=50), _gate_routes(gate))
        client.call(1, "/t.S/Held", Request(id="open"))
        await asyncio.sleep(0.2)  # past the age (50 ms +-10 %)
        client.received()
        assert _goaways(client) == [(age.MAX_STREAM_ID, f.NO_ERROR, b"max_age")]
        [ping] = _pings(client)
        # A call the client sent before it saw the first GOAWAY is still served.
        client.call(3, "/t.S/Echo", Request(id="late"))
        await settle()
        assert client.received()[3].trailers["grpc-status"] == "0"
        client.send(f.frame(f.PING, f.ACK, 0, ping))  # the client has seen the GOAWAY
        client.received()
        assert _goaways(client)[-1] == (3, f.NO_ERROR, b"")
        client.call(5, "/t.S/Echo", Request(id="refused"))  # after the final GOAWAY: refused
        assert client.received()[5].reset == f.REFUSED_STREAM
        assert not client.transport.closed  # the held call still runs
        gate.set()
        await settle()
        streams = client.received()
        assert streams[1].trailers["grpc-status"] == "0" and pb.ModelInferResponse.FromString(
            streams[1].data[5:]).id == "open"
        assert client.transport.closed  # no call left: the connection ends

    run(body)


def test_without_a_ping_answer_the_final_goaway_follows_anyway() -> None:
    async def body() -> None:
        client = Client(GrpcOptions(max_connection_age_ms=20))
        await asyncio.sleep(0.1)
        client.received()
        assert len(_goaways(client)) == 1
        await asyncio.sleep(age.PING_WAIT_S + 0.3)
        client.received()
        assert _goaways(client)[-1] == (0, f.NO_ERROR, b"")
        assert client.transport.closed  # idle: closed with the final GOAWAY

    run(body)


def test_calls_still_open_after_the_grace_are_cut_off() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        client = Client(GrpcOptions(max_connection_age_ms=20, max_connection_age_grace_ms=100), _gate_routes(gate))
        client.call(1, "/t.S/Held", Request(id="stuck"))
        await asyncio.sleep(0.06)
        assert not client.transport.closed  # aged, but within the grace
        await asyncio.sleep(0.3)
        assert client.transport.closed
        gate.set()

    run(body)


def test_no_age_no_goaway() -> None:
    async def body() -> None:
        client = Client(GrpcOptions())
        await asyncio.sleep(0.1)
        client.received()
        assert _goaways(client) == [] and not client.transport.closed

    run(body)


def test_flags_reach_the_options_and_grpcio_channel_options() -> None:
    parser = build_parser()
    argv = ["serve", "--model-repository=/m", "--grpc-max-connection-age-ms=1000",
            "--grpc-max-connection-age-grace-ms", "500"]
    grpc = options_from_args(parser.parse_args(argv), parser).grpc
    assert (grpc.max_connection_age_ms, grpc.max_connection_age_grace_ms) == (1000, 500)
    chosen = dict(channel_options(grpc))
    assert chosen["grpc.max_connection_age_ms"] == 1000 and chosen["grpc.max_connection_age_grace_ms"] == 500
    defaults = dict(channel_options(GrpcOptions()))
    assert "grpc.max_connection_age_ms" not in defaults and "grpc.max_connection_age_grace_ms" not in defaults


def test_a_negative_age_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-repository=/m", "--grpc-max-connection-age-ms=-5"])
    assert "--grpc-max-connection-age-ms: must not be negative, got -5" in capsys.readouterr().err
