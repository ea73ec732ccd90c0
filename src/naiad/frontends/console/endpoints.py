"""The console's HTTP endpoints, served by the KServe HTTP app on its port (http/routes.py names
the paths, http/access.py their API groups):

- `GET /` and `GET /console/{file}`: the page and its static files (no token: they hold no data);
- `GET /console/api/live`: the live data (statistics group; live.py);
- `GET /console/api/models/{m}[/versions/{v}]/config.pbtxt`: the config as text (model-config);
- `POST /console/api/models/{m}[/versions/{v}]/infer`: a V2 JSON inference, answered with its
  response(s) and the timeline of its trace (inference group).

Everything else the page shows comes from the server's public APIs (repository index, load and
unload, config, labels, /v1/chat/completions), so their auth and restricted-API rules hold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from naiad.config.model_config import config_to_pbtxt
from naiad.core.server import InferenceServer
from naiad.errors import InvalidArgument, NaiadError
from naiad.frontends.console.assets import PAGE, assets
from naiad.frontends.console.live import LiveStats
from naiad.frontends.http.codec import decode_infer_request, encode_infer_response
from naiad.frontends.http.reply import RECEIVED, Headers, Reply, error_reply
from naiad.frontends.http.routes import Route
from naiad.observability.tracing import Trace
from naiad.types import InferRequest, InferResponse

Handler = Callable[[InferenceServer, Route, bytes, Headers], Awaitable[Reply]]
#: A decoupled model's answer is cut after this many responses (the page shows them all).
MAX_RESPONSES = 256
_encoder = msgspec.json.Encoder()


class ConsoleEndpoints:
    """The handlers, holding the live data's state (one per server)."""

    def __init__(self, server: InferenceServer, gpu: bool = False) -> None:
        self.live = LiveStats(server, gpu)

    def handlers(self) -> dict[tuple[str, str], Handler]:
        return {
            ("console_page", "GET"): page,
            ("console_asset", "GET"): asset,
            ("console_live", "GET"): self.live_data,
            ("console_config", "GET"): config_text,
            ("console_infer", "POST"): infer,
        }

    async def live_data(self, server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
        return Reply(200, _encoder.encode(self.live.document()), headers=[(b"cache-control", b"no-store")])


async def page(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _asset_reply(PAGE, headers)


async def asset(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _asset_reply(route.asset or "", headers)


def _asset_reply(name: str, headers: Headers) -> Reply:
    found = assets().get(name)
    if found is None:
        return Reply(404, b'{"error":"Not Found"}', b"text/plain")
    cache = [(b"etag", found.etag), (b"cache-control", b"no-cache")]
    if headers.get(b"if-none-match") == found.etag:
        return Reply(304, b"", found.content_type, cache)
    if b"gzip" in headers.get(b"accept-encoding", b""):
        return Reply(200, found.gzipped, found.content_type, [*cache, (b"content-encoding", b"gzip")])
    return Reply(200, found.body, found.content_type, cache)


async def config_text(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    config = server.model_config_message(route.model or "", route.version)
    return Reply(200, config_to_pbtxt(config).encode(), b"text/plain; charset=utf-8")


async def infer(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    """Run one JSON inference traced (whatever the trace settings), and answer
    `{"responses": [...], "trace": [{"name", "ns"}...], "error": str | null}`."""
    if b"inference-header-content-length" in headers:
        raise InvalidArgument("the console's infer endpoint takes JSON only")
    request = decode_infer_request(body, None, route.model or "", route.version)
    # A parent trace makes the core trace this request whatever the sampling settings say (as it
    # does an ensemble's steps); id 0 is "no parent" in the trace file. The trace is held here
    # and handed back to the tracer once the reply is sent, like /infer's.
    request.trace_parent = Trace(0, "", 0, "")
    request.trace_held = True
    received = RECEIVED.get()
    if received is not None:
        request.trace_stamps = [("HTTP_RECV_START", received[0]), ("HTTP_RECV_END", received[1])]
    responses: list[bytes] = []
    error: str | None = None
    try:
        if server.is_decoupled(request.model_name, request.model_version):
            async for response in server.stream(request):
                error = _add_response(responses, response, request)
                if error is not None or len(responses) >= MAX_RESPONSES:
                    break
        else:
            error = _add_response(responses, await server.infer(request), request)
    except NaiadError as failed:  # refused before it was queued: the usual error reply
        return _finishing(server, request, error_reply(failed))
    return _infer_reply(server, request, responses, error)


def _add_response(responses: list[bytes], response: InferResponse, request: InferRequest) -> str | None:
    """Append the response's JSON; its error message, if it carries one."""
    if response.error is not None:
        return str(getattr(response.error, "message", response.error))
    if not response.outputs and response.final and responses:
        return None  # a decoupled model's empty closing response
    out, json_length = encode_infer_response(response, request)
    # Outputs that cannot be JSON (BYTES that are not UTF-8) come binary after the header: the
    # page shows their size only.
    responses.append(out if json_length is None else out[:json_length])
    return None


def _infer_reply(server: InferenceServer, request: InferRequest, responses: list[bytes], error: str | None) -> Reply:
    trace = request.trace
    stamps = sorted(trace.timestamps, key=lambda item: item[1]) if trace is not None else []
    body = b"".join([b'{"responses":[', b",".join(responses), b'],"trace":',
                     _encoder.encode([{"name": name, "ns": ns} for name, ns in stamps]),
                     b',"error":', _encoder.encode(error), b"}"])
    return _finishing(server, request, Reply(200, body, headers=[(b"cache-control", b"no-store")]))


def _finishing(server: InferenceServer, request: InferRequest, reply: Reply) -> Reply:
    """The reply, ending the request's trace (if it got one) once it is sent, as /infer does."""
    trace = request.trace
    if trace is not None:
        reply.on_sent = lambda start, end: server.tracer.finish_sent(trace, "HTTP", (start, end))
    return reply
