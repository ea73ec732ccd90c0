"""The lower rungs of bench/request_budget.py: minimal KServe servers for one FP32 identity model.

Each answers `POST /v2/models/py_identity/infer` (Triton's binary tensor extension, as
perf_analyzer sends it) by handing the input's bytes to a child process over a Unix socket and
answering with what comes back: the same process shape as naiad's Python backend, with as little
Python as possible around it. `--mode` picks what runs around that hop:

- `floor`: httptools callbacks and one `transport.write`; nothing else;
- `http`:  naiad's own HTTP/1.1 protocol (`frontends/http/protocol.py`) instead;
- `codec`: that, plus naiad's KServe codec (`decode_infer_request` / `encode_infer_response`).

Metadata and config are canned; `/v2/health/ready` answers 200 (the harness polls it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import httptools
import numpy as np
import uvloop

from naiad.frontends.http.codec import decode_infer_request, encode_infer_response
from naiad.frontends.http.protocol import Connections, HttpProtocol
from naiad.frontends.http.reply import Reply
from naiad.types import DataType, InferRequest, InferResponse, Tensor

MODEL = "py_identity"
WIDTH = 16  # FP32 elements per request: perf_analyzer's --shape INPUT0:16, one row
METADATA = json.dumps({"name": MODEL, "versions": ["1"], "platform": "python",
                       "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
                       "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]}).encode()
CONFIG = json.dumps({"name": MODEL, "platform": "", "backend": "python", "max_batch_size": 8,
                     "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "instance_group": [{"name": f"{MODEL}_0", "kind": "KIND_CPU", "count": 1}]}).encode()
_LENGTH = struct.Struct("<I")


def _echo(sock: socket.socket) -> None:
    """The child: length-prefixed frames back as they came."""
    buffer = b""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return
        buffer += data
        while len(buffer) >= 4 and len(buffer) >= 4 + _LENGTH.unpack_from(buffer)[0]:
            end = 4 + _LENGTH.unpack_from(buffer)[0]
            sock.sendall(buffer[:end])
            buffer = buffer[end:]


class Hop:
    """The server's end of the socket: send a payload, call its callback with the answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.waiting: collections.deque[Callable[[bytes], None]] = collections.deque()
        self.buffer = b""

    def send(self, payload: bytes, answered: Callable[[bytes], None]) -> None:
        self.waiting.append(answered)
        self.sock.send(_LENGTH.pack(len(payload)) + payload)

    def readable(self) -> None:
        self.buffer += self.sock.recv(1 << 16)
        while len(self.buffer) >= 4 and len(self.buffer) >= 4 + _LENGTH.unpack_from(self.buffer)[0]:
            end = 4 + _LENGTH.unpack_from(self.buffer)[0]
            payload, self.buffer = self.buffer[4:end], self.buffer[end:]
            self.waiting.popleft()(payload)


def _binary_head(payload_size: int) -> bytes:
    return json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, payload_size // 4],
         "parameters": {"binary_data_size": payload_size}}]}, separators=(",", ":")).encode()


def _canned(path: bytes | str) -> bytes:
    text = path.decode("latin-1") if isinstance(path, bytes) else path
    if text.endswith("/config"):
        return CONFIG
    if text.endswith("/ready"):
        return b""
    return METADATA


class FloorProtocol(asyncio.Protocol):
    """httptools and one write per answer; no limits, no timers, no queue (perf_analyzer only)."""

    def __init__(self, hop: Hop) -> None:
        self.hop = hop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", {}, b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        if not self.url.endswith(b"/infer"):
            self._write(_canned(self.url), b"application/json", b"")
            return
        json_size = int(self.headers.get(b"inference-header-content-length", b"0"))
        self.hop.send(self.body[json_size:], self._answer)

    def _answer(self, payload: bytes) -> None:
        head = _binary_head(len(payload))
        self._write(head + payload, b"application/octet-stream",
                    b"inference-header-content-length: %d\r\n" % len(head))

    def _write(self, body: bytes, content_type: bytes, extra: bytes) -> None:
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
                                 % (content_type, len(body), extra) + body)


def naiad_protocol(hop: Hop, with_codec: bool) -> Callable[[], HttpProtocol]:
    """naiad's HTTP/1.1 protocol around the hop, with or without the KServe codec."""
    connections = Connections()

    async def dispatch(method: str, path: str, headers: Any, body: bytes) -> tuple[Reply, list[tuple[bytes, bytes]]]:
        return Reply(200, _canned(path)), []

    def dispatch_now(method: str, path: str, headers: Any, body: bytes,
                     answer: Callable[[Reply, list[tuple[bytes, bytes]]], None]) -> Any:
        if not path.endswith("/infer"):
            return dispatch(method, path, headers, body)
        json_size = int(headers.get(b"inference-header-content-length", b"0"))
        if not with_codec:
            def raw(payload: bytes) -> None:
                head = _binary_head(len(payload))
                answer(Reply(200, head + payload, b"application/octet-stream",
                             [(b"inference-header-content-length", b"%d" % len(head))]), [])
            hop.send(body[json_size:], raw)
            return _nothing
        request = decode_infer_request(body, json_size, MODEL, None)

        def decoded(payload: bytes) -> None:
            answer(_encoded(request, payload), [])
        hop.send(request.inputs[0].data.tobytes(), decoded)
        return _nothing

    return lambda: HttpProtocol(dispatch, 64 << 20, connections, dispatch_now=dispatch_now)


def _encoded(request: InferRequest, payload: bytes) -> Reply:
    output = np.frombuffer(payload, np.float32).reshape(1, -1)
    response = InferResponse(MODEL, "1", [Tensor("OUTPUT0", DataType.FP32, output.shape, output)], request.id)
    body, json_size = encode_infer_response(response, request, ())
    if json_size is None:
        return Reply(200, body)
    return Reply(200, body, b"application/octet-stream", [(b"inference-header-content-length", b"%d" % json_size)])


def _nothing() -> None:
    pass


async def serve(mode: str, port: int) -> None:
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        _echo(theirs)
        os._exit(0)
    theirs.close()
    ours.setblocking(False)
    hop = Hop(ours)
    loop = asyncio.get_running_loop()
    loop.add_reader(ours.fileno(), hop.readable)
    factory = (lambda: FloorProtocol(hop)) if mode == "floor" else naiad_protocol(hop, mode == "codec")
    await loop.create_server(factory, "127.0.0.1", port)
    await asyncio.Future()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("floor", "http", "codec"), required=True)
    parser.add_argument("--http-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.mode, args.http_port))


if __name__ == "__main__":
    main()
