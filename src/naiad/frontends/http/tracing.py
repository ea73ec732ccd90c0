"""What HTTP hands the core for tracing: the client's W3C trace context and the times its
request was read (HTTP_RECV_START/END), set only while tracing is on."""

from __future__ import annotations

from naiad.core.server import InferenceServer
from naiad.frontends.http.reply import RECEIVED, Headers
from naiad.types import InferRequest


def trace_context(headers: Headers) -> dict[str, str] | None:
    """The W3C trace context headers, when the client sent a traceparent."""
    parent = headers.get(b"traceparent")
    if parent is None:
        return None
    context = {"traceparent": parent.decode("latin-1")}
    state = headers.get(b"tracestate")
    if state is not None:
        context["tracestate"] = state.decode("latin-1")
    return context


def carry_trace(server: InferenceServer, request: InferRequest, headers: Headers) -> None:
    """Give a request its trace context and receive stamps (the core ends its trace at the final
    response: streamed and OpenAI replies have no single send time)."""
    if not server.tracer.active:
        return
    request.trace_context = trace_context(headers)
    received = RECEIVED.get()
    if received is not None:
        request.trace_stamps = [("HTTP_RECV_START", received[0]), ("HTTP_RECV_END", received[1])]
