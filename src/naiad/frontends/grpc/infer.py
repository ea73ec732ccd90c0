"""One inference request through the core, shared by ModelInfer and ModelStreamInfer: decode,
forward headers, shared memory in and out."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from tritonclient.grpc import service_pb2 as pb

from naiad.core.server import InferenceServer
from naiad.frontends import shared_memory as shm
from naiad.frontends.grpc.codec import decode_infer_request
from naiad.frontends.grpc.status import as_naiad_error
from naiad.types import InferRequest, InferResponse

DECOUPLED_ERROR = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_NOTHING: frozenset[str] = frozenset()

Metadata = Iterable[tuple[str, str | bytes]]


class HasMetadata(Protocol):
    def invocation_metadata(self) -> Metadata | None: ...


def decode(message: pb.ModelInferRequest, context: HasMetadata, forward_pattern: str,
           tracing: bool = False) -> InferRequest:
    """The request, with the client metadata that --grpc-header-forward-pattern selects and, while
    tracing is on, the W3C trace context (the metadata is read only when one of them needs it)."""
    request = decode_infer_request(message)
    if not (forward_pattern or tracing):
        return request
    metadata = context.invocation_metadata() or ()
    if forward_pattern:
        forward_headers(request.parameters, metadata, forward_pattern)
    if tracing:
        trace = {key: value for key, value in metadata
                 if key in ("traceparent", "tracestate") and isinstance(value, str)}
        if "traceparent" in trace:
            request.trace_context = trace
    return request


def forward_headers(parameters: dict[str, Any], metadata: Metadata, pattern: str) -> None:
    """Metadata keys matching `pattern` (case-insensitively) become string request parameters;
    binary (`-bin`) metadata is not text and is never forwarded."""
    regex = re.compile(pattern, re.IGNORECASE)  # re caches compiled patterns
    for key, value in metadata:
        if isinstance(value, str) and regex.search(key):
            parameters[key] = value


async def infer(server: InferenceServer, request: InferRequest) -> tuple[InferResponse, frozenset[str]]:
    """The one response to a unary request and the outputs written to shared memory; raises
    the response's error."""
    if not shm.uses_shared_memory(request):
        return _checked(await server.infer(request, DECOUPLED_ERROR)), _NOTHING
    held = shm.begin(request, server.shared_memory)
    try:
        response = _checked(await server.infer(request, DECOUPLED_ERROR))
        return response, frozenset(held.write_outputs(response))
    finally:
        held.release()


async def stream(server: InferenceServer, request: InferRequest) -> AsyncIterator[tuple[InferResponse, frozenset[str]]]:
    """Every response to a streamed request (decoupled or not) with its outputs written to
    shared memory; a response's error stays in the response."""
    if not shm.uses_shared_memory(request):
        async for response in server.stream(request):
            yield response, _NOTHING
        return
    held = shm.begin(request, server.shared_memory)
    try:
        async for response in server.stream(request):
            written = _NOTHING
            if response.error is None and response.outputs:
                written = frozenset(held.write_outputs(response))
            yield response, written
    finally:
        held.release()


def _checked(response: InferResponse) -> InferResponse:
    if response.error is not None:
        raise as_naiad_error(response.error)
    return response
