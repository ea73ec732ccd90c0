"""One coroutine per HTTP endpoint; each turns a route and body into a Reply."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Collection
from importlib import resources
from typing import Any

import msgspec

from naiad.core.labels import REQUEST_PARAMETER
from naiad.core.server import InferenceServer, Region
from naiad.errors import InternalError, InvalidArgument, NaiadError
from naiad.frontends import shared_memory as shm
from naiad.frontends.http import openai, openai_embeddings, openai_scoring, openai_tokens
from naiad.frontends.http.codec import decode_infer_request, decode_raw_request, encode_infer_response
from naiad.frontends.http.generate import generate, generate_stream
from naiad.frontends.http.reply import RECEIVED, Headers, Reply, error_reply, json_reply
from naiad.frontends.http.routes import Route
from naiad.frontends.http.tracing import trace_context
from naiad.types import InferRequest, InferResponse

log = logging.getLogger(__name__)

_DECOUPLED_ERROR = "HTTP end point doesn't support models with decoupled transaction policy"
Handler = Callable[[InferenceServer, Route, bytes, Headers], Awaitable[Reply]]
_json = json_reply
_reply = Reply


def _bool_reply(ok: bool, false_body: bytes = b"") -> Reply:
    # Triton sends this error body as text/plain (SPEC §0).
    return _reply(200) if ok else _reply(400, false_body, b"text/plain")


def _parse_json(body: bytes) -> Any:
    if not body.strip():
        return {}
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise InvalidArgument(f"failed to parse the request JSON buffer: {error}") from None


async def live(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _bool_reply(server.is_live())


async def ready_server(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _bool_reply(server.is_ready())


async def server_metadata(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.metadata())


@functools.cache
def _openapi_document() -> bytes:
    # Package data, read once: the document describes the routes and handlers of this package.
    return resources.files(__package__).joinpath("openapi.json").read_bytes()


async def openapi_document(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _reply(200, _openapi_document())


def _version(server: InferenceServer, route: Route, loaded_only: bool = True) -> int | None:
    """The version the path names: /versions/{v}, /labels/{label} (resolved now), or None."""
    if route.label is None:
        return route.version
    return server.label_version(route.model or "", route.label, loaded_only)


async def model_ready(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    # A label naming a version that does not serve is "not ready"; an unknown label is an error.
    ready = server.model_ready(route.model or "", _version(server, route, loaded_only=False))
    return _bool_reply(ready, b'{"error":"Model version not ready"}')


async def model_metadata(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.model_metadata(route.model or "", _version(server, route)))


async def model_config(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.model_config(route.model or "", _version(server, route)))


async def model_stats(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.statistics(route.model, _version(server, route)))


async def model_labels(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.version_labels(route.model or ""))


async def stats_all(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.statistics(None, None))


async def model_infer(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    if not server.tracer.active:
        return await _model_infer(server, route, body, headers, None)
    # Traced requests carry their HTTP_RECV stamps in and end once their reply is written.
    received = RECEIVED.get()
    holder: list[InferRequest] = []
    try:
        reply = await _model_infer(server, route, body, headers, (received, holder))
    except NaiadError as error:
        reply = error_reply(error)
    trace = holder[0].trace if holder else None
    if trace is not None:
        reply.on_sent = lambda start, end: server.tracer.finish_sent(trace, "HTTP", (start, end))
    return reply


async def _model_infer(server: InferenceServer, route: Route, body: bytes, headers: Headers,
                       tracing: tuple[tuple[int, int] | None, list[InferRequest]] | None) -> Reply:
    request = _decode(server, route, body, headers)
    if tracing is not None:
        received, holder = tracing
        request.trace_context = trace_context(headers)
        request.trace_held = True
        if received is not None:
            request.trace_stamps = [("HTTP_RECV_START", received[0]), ("HTTP_RECV_END", received[1])]
        holder.append(request)
    if shm.uses_shared_memory(request):
        return await _infer_shared_memory(server, request)
    return _infer_reply(await _infer(server, request), request)


def model_infer_now(server: InferenceServer, route: Route, body: bytes, headers: Headers,
                    answer: Callable[[Reply], None]) -> Callable[[], None]:
    """The infer endpoint without a task of its own: decode, queue, and call `answer` with the
    reply on the event loop once the response is in; returns what cancels the request if the
    client goes away."""
    request = _decode(server, route, body, headers)
    if shm.uses_shared_memory(request):
        return _infer_shared_memory_now(server, request, answer)

    def answered(response: InferResponse) -> None:
        error = response.error
        if error is None:
            answer(_infer_reply(response, request))
        else:
            answer(error_reply(error if isinstance(error, NaiadError) else NaiadError(str(error))))

    return server.infer_soon(request, answered, _DECOUPLED_ERROR)


def _infer_shared_memory_now(server: InferenceServer, request: InferRequest,
                             answer: Callable[[Reply], None]) -> Callable[[], None]:
    """`_infer_shared_memory` without a task of its own (with one, and its coroutines and future,
    identity over shared memory at 32 connections served 0.77x the requests a second; docs/
    benchmarks.md): the regions stay open, even if a client unregisters them, until the outputs
    are written or the request is cancelled."""
    held = shm.begin(request, server.shared_memory)

    def answered(response: InferResponse) -> None:
        error = response.error
        written: set[str] = set()
        try:
            if error is None:
                written = held.write_outputs(response)
        except NaiadError as failed:
            error = failed
        except Exception:  # a bug: answered as the task path answers one
            log.exception("unhandled error")
            answer(Reply(500, b'{"error":"internal server error"}'))
            return
        finally:
            held.release()
        if error is None:
            answer(_infer_reply(response, request, written))
        else:
            answer(error_reply(error if isinstance(error, NaiadError) else NaiadError(str(error))))

    try:
        cancel = server.infer_soon(request, answered, _DECOUPLED_ERROR)
    except BaseException:
        held.release()
        raise
    return shm.cancelling(cancel, held)


def _decode(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> InferRequest:
    model = route.model or ""
    header_length = _header_length(headers)
    if header_length == 0:
        inputs, max_batch_size = server.model_inputs(model, _version(server, route))
        request = decode_raw_request(body, inputs[0], len(inputs), model, route.version,
                                     batching=max_batch_size > 0)
    else:
        request = decode_infer_request(body, header_length, model, route.version)
    if route.label is not None:
        _route_label(request, route.label)
    pattern = server.options.http_header_forward_pattern
    if pattern:
        forward_headers(request.parameters, headers, pattern)
    return request


async def _infer(server: InferenceServer, request: InferRequest) -> InferResponse:
    response = await server.infer(request, _DECOUPLED_ERROR)
    if response.error is not None:
        error = response.error
        raise error if isinstance(error, NaiadError) else NaiadError(str(error))
    return response


async def _infer_shared_memory(server: InferenceServer, request: InferRequest) -> Reply:
    """Inputs read from and outputs written to registered regions, which stay open until the
    response is written even if a client unregisters them meanwhile."""
    held = shm.begin(request, server.shared_memory)
    try:
        response = await _infer(server, request)
        written = held.write_outputs(response)
    finally:
        held.release()
    return _infer_reply(response, request, written)


def _infer_reply(response: InferResponse, request: InferRequest, in_shared_memory: Collection[str] = ()) -> Reply:
    out, json_length = encode_infer_response(response, request, in_shared_memory)
    if json_length is None:
        return _reply(200, out)
    return _reply(200, out, b"application/octet-stream",
                  [(b"inference-header-content-length", str(json_length).encode())])


def _route_label(request: InferRequest, label: str) -> None:
    """The label in the path becomes the request's `version_label` (the core routes by it)."""
    named = request.parameters.get(REQUEST_PARAMETER)
    if named is not None and named != label:
        raise InvalidArgument(f"the path names label '{label}' but the '{REQUEST_PARAMETER}' "
                              f"parameter names '{named}'")
    request.parameters[REQUEST_PARAMETER] = label


def forward_headers(parameters: dict[str, Any], headers: Headers, pattern: str) -> None:
    """--http-header-forward-pattern: headers whose name matches (case-insensitively) become
    string request parameters, as Triton forwards them to the model."""
    if not pattern:
        return
    regex = re.compile(pattern, re.IGNORECASE)  # re caches compiled patterns
    for name, value in headers.items():
        key = name.decode("latin-1")
        if regex.search(key):
            parameters[key] = value.decode("latin-1")


def _header_length(headers: Headers) -> int | None:
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(
            f"Unable to parse inference header size, got: {value.decode('latin-1')}"
        ) from None


async def index(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    request = _parse_json(body)
    ready = bool(request.get("ready", False)) if isinstance(request, dict) else False
    return _json(server.repository_index(ready))


async def load(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    parameters = _parameters(body)
    for key, value in list(parameters.items()):
        if key.startswith("file:"):
            parameters[key] = _base64(key, value)
        elif key == "config" and not isinstance(value, str):
            raise InvalidArgument("'config' parameter must be a JSON string")
    await asyncio.get_running_loop().run_in_executor(None, server.load_model, route.model or "", parameters)
    return _reply(200)


async def unload(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    parameters = _parameters(body)
    await asyncio.get_running_loop().run_in_executor(None, server.unload_model, route.model or "", parameters)
    return _reply(200)


def _parameters(body: bytes) -> dict[str, Any]:
    request = _parse_json(body)
    parameters = request.get("parameters", {}) if isinstance(request, dict) else None
    if not isinstance(parameters, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    return parameters


def _base64(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"file parameter '{key}' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"unable to decode base64 content of '{key}'") from None


# --------------------------------------------------------------------------------- shared memory


async def shm_status(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json([_region_json(region) for region in server.shared_memory.status(route.region)])


async def shm_register(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    if route.region is None:
        raise InvalidArgument("'region name' is necessary to register system shared memory region")
    key, offset, byte_size = _register_request(_parse_json(body))
    server.shared_memory.register(route.region, key, offset, byte_size)
    return _reply(200)


async def shm_unregister(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    server.shared_memory.unregister(route.region)
    return _reply(200)


def _register_request(request: Any) -> tuple[str, int, int]:
    """(key, offset, byte_size) of a register body, with Triton's texts (its JSON reader's type
    errors are INTERNAL, so 500)."""
    request = request if isinstance(request, dict) else {}
    if "key" not in request:
        raise InvalidArgument("Shared memory register request has no 'key' field")
    key = request["key"]
    if not isinstance(key, str):
        raise InternalError("attempt to access JSON non-string as string")
    offset = _register_uint(request.get("offset", 0))
    if "byte_size" not in request:
        raise InvalidArgument("Shared memory register request has no 'byte_size' field")
    return key, offset, _register_uint(request["byte_size"])


def _register_uint(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**64:
        raise InternalError("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _region_json(region: Region) -> dict[str, Any]:
    return {"name": region.name, "key": region.key, "offset": region.offset, "byte_size": region.byte_size}


async def cuda_status(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(shm.cuda_status(server.shared_memory, route.region))


async def cuda_register(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    if route.region is None:
        raise InvalidArgument("'region name' is necessary to register cuda shared memory region")
    raise shm.cuda_register_error(route.region)


async def cuda_unregister(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _reply(200)  # no CUDA region can have been registered


# --------------------------------------------------------------------------------------- logging


async def get_logging(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.logging.get())


async def post_logging(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    changes = _parse_json(body)
    if not isinstance(changes, dict):
        raise InvalidArgument("logging settings must be a JSON object")
    return _json(server.logging.update(changes))


async def get_trace(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return _json(server.trace_settings(route.model))


async def post_trace(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    changes = _parse_json(body)
    if not isinstance(changes, dict):
        raise InvalidArgument("trace settings must be a JSON object")
    return _json(server.trace_settings(route.model, changes))


HANDLERS: dict[tuple[str, str], Handler] = {
    ("live", "GET"): live,
    ("ready_server", "GET"): ready_server,
    ("server_metadata", "GET"): server_metadata,
    ("openapi", "GET"): openapi_document,
    ("model_ready", "GET"): model_ready,
    ("model_metadata", "GET"): model_metadata,
    ("model_config", "GET"): model_config,
    ("model_stats", "GET"): model_stats,
    ("model_labels", "GET"): model_labels,
    ("stats_all", "GET"): stats_all,
    ("model_infer", "POST"): model_infer,
    ("model_generate", "POST"): generate,
    ("model_generate_stream", "POST"): generate_stream,
    ("index", "POST"): index,
    ("load", "POST"): load,
    ("unload", "POST"): unload,
    ("trace", "GET"): get_trace,
    ("trace", "POST"): post_trace,
    ("logging", "GET"): get_logging,
    ("logging", "POST"): post_logging,
    ("shm_status", "GET"): shm_status,
    ("shm_register", "POST"): shm_register,
    ("shm_unregister", "POST"): shm_unregister,
    ("cuda_status", "GET"): cuda_status,
    ("cuda_register", "POST"): cuda_register,
    ("cuda_unregister", "POST"): cuda_unregister,
    ("openai_models", "GET"): openai.models,
    ("openai_completions", "POST"): openai.completions,
    ("openai_chat_completions", "POST"): openai.chat_completions,
    ("openai_tokenize", "POST"): openai_tokens.tokenize,
    ("openai_detokenize", "POST"): openai_tokens.detokenize,
    ("openai_embeddings", "POST"): openai_embeddings.embeddings,
    ("openai_rerank", "POST"): openai_scoring.rerank,
    ("openai_score", "POST"): openai_scoring.score,
}
