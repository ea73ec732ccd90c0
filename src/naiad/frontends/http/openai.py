"""An OpenAI-compatible front door to "llm" models: `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions`, enough for the `openai` Python client unmodified.

Each call becomes one request to the model's `text_input` with sampling settings as request
parameters, as Triton's generate endpoint would send it. Chat messages go to the backend as a
JSON array with `apply_chat_template` set: the chat template belongs to the model, and frontends
may not import naiad.llm. `stream: true` answers with server-sent events `data: {...}` ending
in `data: [DONE]`.

Not supported (a 400 rather than a silent difference): n other than 1, stop, logprobs, tools.
Not reported: `usage` (the backend sends text only, no token counts), and finish_reason is
always "stop" (the backend does not say whether max_tokens ended the answer).
Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, cast

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError, NotFound
from naiad.frontends.http.reply import HTTP_STATUS, Reply, StreamReply
from naiad.frontends.http.routes import Route
from naiad.types import DataType, InferRequest, InferResponse, Tensor

Headers = dict[bytes, bytes]
Body = dict[str, Any]
#: one chunk's JSON for a piece of streamed text (None: the closing chunk with finish_reason)
ChunkMaker = Callable[[str | None], Body]

LLM_BACKEND = "llm"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_DONE = b"data: [DONE]\n\n"
# Request keys the frontend understands; anything else the client sends is ignored, as the
# OpenAI API tolerates extra fields (the client itself sends none unless asked).
_UNSUPPORTED = {"n": 1, "stop": None, "logprobs": None, "top_logprobs": None, "tools": None, "best_of": None,
                "suffix": None, "echo": False}
_encoder = msgspec.json.Encoder()


# ---------------------------------------------------------------------------------------- handlers


async def models(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "naiad"} for name in _llm_models(server)]
    return Reply(200, _encoder.encode({"object": "list", "data": data}))


async def completions(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return await _answer(server, body, chat=False)


async def chat_completions(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return await _answer(server, body, chat=True)


async def _answer(server: InferenceServer, body: bytes, chat: bool) -> Reply:
    """Every OpenAI error leaves here in OpenAI's shape, not Triton's."""
    try:
        request_body = _parse(body)
        request = _infer_request(server, request_body, chat)
        if request_body.get("stream", False):
            return await _stream(server, request, _chunk_maker(request.model_name, chat))
        text = await _whole_text(server, request)
        return Reply(200, _encoder.encode(_completion(request.model_name, text, chat)))
    except NaiadError as error:
        return openai_error(error)


# ------------------------------------------------------------------------------------- requests


def _llm_models(server: InferenceServer) -> list[str]:
    names = sorted({entry["name"] for entry in server.repository_index(ready_only=True)})
    return [name for name in names if server.model_config_message(name, None).backend == LLM_BACKEND]


def _parse(body: bytes) -> Body:
    try:
        document = json.loads(body)
    except ValueError as error:
        raise InvalidArgument(f"the request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return document


def _infer_request(server: InferenceServer, body: Body, chat: bool) -> InferRequest:
    model = _model(server, body.get("model"))
    _refuse_unsupported(body)
    text = _messages_json(body.get("messages")) if chat else _prompt(body.get("prompt"))
    request = InferRequest(model, None, [_text_input(text)], parameters=_sampling(body))
    request.parameters["stream"] = bool(body.get("stream", False))
    if chat:
        request.parameters["apply_chat_template"] = True
    return request


def _model(server: InferenceServer, model: Any) -> str:
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' must be a model name")
    # Only "llm" models take text_input with sampling parameters; any other is unknown here.
    if model not in _llm_models(server):
        raise NotFound(f"The model '{model}' does not exist")
    return model


def _refuse_unsupported(body: Body) -> None:
    for key, default in _UNSUPPORTED.items():
        if body.get(key, default) != default:
            raise InvalidArgument(f"'{key}' is not supported by this server")


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # the client may send a one-prompt batch
    if not isinstance(prompt, str):
        raise InvalidArgument("'prompt' must be a string")
    return prompt


def _messages_json(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("'messages' must be a non-empty array")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise InvalidArgument("each message needs a string 'role' and a string 'content'")
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in messages])


def _sampling(body: Body) -> dict[str, Any]:
    """The backend's sampling parameters; OpenAI's ranges are checked here, the backend checks
    the rest (so the messages stay the same as through /generate)."""
    parameters: dict[str, Any] = {}
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise InvalidArgument(f"'temperature' must be a number between 0 and 2, got {temperature!r}")
        parameters["temperature"] = float(temperature)
    # ignore_eos, top_k and min_p are vLLM's extensions (the bench asks for exact lengths).
    for key in ("max_completion_tokens", "max_tokens", "top_p", "seed", "ignore_eos", "top_k", "min_p"):
        if body.get(key) is not None:
            parameters["max_tokens" if key == "max_completion_tokens" else key] = body[key]
    return parameters


def _text_input(text: str) -> Tensor:
    data = np.array([text.encode("utf-8")], dtype=object)
    return Tensor("text_input", DataType.BYTES, (1,), data)


# ------------------------------------------------------------------------------------ responses


async def _whole_text(server: InferenceServer, request: InferRequest) -> str:
    pieces = []
    async for response in server.stream(request):
        pieces.append(_text(response))
    return "".join(pieces)


def _text(response: InferResponse) -> str:
    """The text a response carries ("" for the flags-only final); its error raises."""
    if response.error is not None:
        error = response.error
        raise error if isinstance(error, NaiadError) else InternalError(str(error))
    for tensor in response.outputs:
        if tensor.name == "text_output":
            return b"".join(np.asarray(tensor.data).ravel().tolist()).decode("utf-8", "replace")
    return ""


def _completion(model: str, text: str, chat: bool) -> Body:
    choice: Body = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": _new_id(chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def _chunk_maker(model: str, chat: bool) -> ChunkMaker:
    """Chunks share one id and creation time, as OpenAI's do."""
    ident, created = _new_id(chat), int(time.time())

    def chunk(text: str | None) -> Body:
        choice: Body = {"index": 0, "finish_reason": "stop" if text is None else None, "logprobs": None}
        if chat:
            choice["delta"] = {} if text is None else {"role": "assistant", "content": text}
        else:
            choice["text"] = text or ""
        return {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": model, "choices": [choice]}

    return chunk


def _new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


async def _stream(server: InferenceServer, request: InferRequest, chunk: ChunkMaker) -> Reply:
    responses = cast(AsyncGenerator[InferResponse, None], server.stream(request))
    first = await anext(responses)
    if first.error is not None:
        # The backend validates before scheduling: a bad setting is still an ordinary error reply.
        await responses.aclose()
        _text(first)
    return StreamReply(200, _Events(first, responses, chunk), SSE_CONTENT_TYPE)


class _Events:
    """The SSE body: a chunk per piece of text, then the closing chunk and `[DONE]`."""

    def __init__(self, first: InferResponse, responses: AsyncGenerator[InferResponse, None],
                 chunk: ChunkMaker) -> None:
        self._responses = responses
        self._body = self._events(first, chunk)

    async def _events(self, first: InferResponse, chunk: ChunkMaker) -> AsyncGenerator[bytes, None]:
        response: InferResponse | None = first
        while response is not None:
            try:
                text = _text(response)
            except NaiadError as error:  # after the 200 is sent, an error can only be an event
                yield _sse(_error_body(error))
                return
            if text:
                yield _sse(chunk(text))
            response = await anext(self._responses, None)
        yield _sse(chunk(None))
        yield _DONE

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body

    async def aclose(self) -> None:
        # Closing server.stream marks the request cancelled, so a client that leaves stops the engine.
        await self._body.aclose()
        await self._responses.aclose()


def _sse(value: Body) -> bytes:
    return b"data: " + _encoder.encode(value) + b"\n\n"


# --------------------------------------------------------------------------------------- errors


def openai_error(error: NaiadError) -> Reply:
    status = HTTP_STATUS.get(error.status, 400)
    return Reply(status, _encoder.encode(_error_body(error)))


def _error_body(error: NaiadError) -> Body:
    status = HTTP_STATUS.get(error.status, 400)
    kind = {404: "not_found_error", 500: "internal_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": None,
                      "code": "model_not_found" if status == 404 else None}}
