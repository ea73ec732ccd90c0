"""--http-max-requests-per-connection on HttpProtocol (fake transport, as test_protocol.py):
the Nth response says `connection: close` and the connection closes."""

from __future__ import annotations

import asyncio

import pytest
from frontends.http.test_protocol import FakeTransport, _echo_path

from naiad.cli import build_parser, options_from_args
from naiad.frontends.http.protocol import Connections, HttpProtocol

GET = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"


async def _exchange(protocol: HttpProtocol, transport: FakeTransport, request: bytes) -> bytes:
    transport.data = b""
    protocol.data_received(request)
    for _ in range(20):
        await asyncio.sleep(0.001)
    return transport.data


def _serve(max_requests: int, count: int) -> tuple[list[bytes], FakeTransport]:
    async def main() -> tuple[list[bytes], FakeTransport]:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), max_requests=max_requests)
        protocol.connection_made(transport)
        answers = []
        for _ in range(count):
            answers.append(await _exchange(protocol, transport, GET))
            if transport.closed:
                break
        return answers, transport

    return asyncio.run(main())


def test_the_nth_response_closes_the_connection() -> None:
    answers, transport = _serve(max_requests=3, count=5)
    assert len(answers) == 3 and all(answer.startswith(b"HTTP/1.1 200 OK\r\n") for answer in answers)
    assert [b"connection: close\r\n" in answer for answer in answers] == [False, False, True]
    assert transport.closed


def test_a_limit_of_one_closes_after_every_response() -> None:
    answers, transport = _serve(max_requests=1, count=2)
    assert len(answers) == 1 and b"connection: close\r\n" in answers[0] and transport.closed


def test_no_limit_by_default() -> None:
    answers, transport = _serve(max_requests=0, count=50)
    assert len(answers) == 50 and not any(b"connection: close" in answer for answer in answers)
    assert not transport.closed


def test_flag_reaches_the_options_and_rejects_a_negative(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--model-repository=/m", "--http-max-requests-per-connection=100"])
    assert options_from_args(args, parser).http_max_requests_per_connection == 100
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model-repository=/m", "--http-max-requests-per-connection=x"])
    assert "expected a whole number, got 'x'" in capsys.readouterr().err
