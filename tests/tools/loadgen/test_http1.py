"""The HTTP/1.1 control client reconnects when a server closes its keep-alive connection."""

from __future__ import annotations

import asyncio

from naiad.tools.loadgen.http1 import HttpControl, request_bytes


def test_control_calls_survive_connection_close() -> None:
    async def run() -> list[tuple[int, bytes]]:
        connections = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            body = f"answer {connections}".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        control = HttpControl("127.0.0.1", port)
        answers = [await control.request("GET", "/a"), await control.request("GET", "/b")]
        control.close()
        server.close()
        return answers

    assert asyncio.run(run()) == [(200, b"answer 1"), (200, b"answer 2")]


def test_request_bytes() -> None:
    raw = request_bytes("POST", "h:1", "/p", b"{}", {"Content-Type": "application/json"})
    assert raw == b"POST /p HTTP/1.1\r\nHost: h:1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
