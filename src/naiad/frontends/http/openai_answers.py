"""What an "llm" model answers, as OpenAI's choices: each backend response read into a `Piece`,
the pieces of one request added up into a `Choice`, the usage of a call's choices, and errors in
OpenAI's shape `{"error": {"message", "type", "param", "code"}}` (the other OpenAI routes use
`openai_error` too)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, NaiadError
from naiad.frontends.http.reply import HTTP_STATUS, Reply
from naiad.types import InferRequest, InferResponse

Body = dict[str, Any]

_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class Piece:
    """What one backend response carries."""

    text: str = ""
    finish_reason: str = ""  # "" until the end
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[Body] = field(default_factory=list)
    cached_tokens: int | None = None
    timings: Body | None = None  # on the last: queue_ms, prefill_ms, decode_ms
    prompt_text: str | None = None  # with echo, on the first
    prompt_logprobs: list[Body] | None = None  # with echo and logprobs, on the first


#: the backend's response parameters that say where a request's time went
TIMINGS = ("queue_ms", "prefill_ms", "decode_ms")


@dataclass(slots=True)
class Choice:
    """One choice's answer so far."""

    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[Body] = field(default_factory=list)
    offset: int = 0  # text length of its logprob tokens so far (completions' text_offset)
    cached_tokens: int = 0  # of the prompt's, found in the prefix cache
    timings: Body | None = None

    def add(self, piece: Piece) -> None:
        if piece.prompt_text is not None:  # echo: the prompt comes first
            piece.text = piece.prompt_text + piece.text
            piece.logprobs = (piece.prompt_logprobs or []) + piece.logprobs
        self.timings = piece.timings or self.timings
        self.text += piece.text
        self.finish_reason = piece.finish_reason or self.finish_reason
        if piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.cached_tokens is not None:
            self.cached_tokens = piece.cached_tokens
        if piece.completion_tokens is not None:
            self.completion_tokens = piece.completion_tokens
        self.logprobs.extend(piece.logprobs)


def usage(choices: list[Choice], n: int = 1) -> Body:
    """Each prompt counts once (its `n` choices share it), the completions of every choice add up."""
    prompt = sum(choice.prompt_tokens for choice in choices[::n])
    cached = sum(choice.cached_tokens for choice in choices[::n])
    completion = sum(choice.completion_tokens for choice in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def collect(server: InferenceServer, request: InferRequest) -> Choice:
    choice = Choice()
    async for response in server.stream(request):
        choice.add(response_piece(response))
    return choice


def response_piece(response: InferResponse) -> Piece:
    """What a response carries (nothing for the flags-only final); its error raises."""
    if response.error is not None:
        error = response.error
        raise error if isinstance(error, NaiadError) else InternalError(str(error))
    piece = Piece()
    cached = response.parameters.get("cached_tokens")
    if isinstance(cached, int):
        piece.cached_tokens = cached
    if isinstance(response.parameters.get("prompt_text"), str):
        piece.prompt_text = response.parameters["prompt_text"]
    if isinstance(response.parameters.get("prompt_logprobs"), str):
        piece.prompt_logprobs = json.loads(response.parameters["prompt_logprobs"])
    if "decode_ms" in response.parameters:
        piece.timings = {key: response.parameters.get(key) for key in TIMINGS}
    for tensor in response.outputs:
        values = np.asarray(tensor.data).ravel().tolist()
        if tensor.name == "text_output":
            piece.text = b"".join(values).decode("utf-8", "replace")
        elif tensor.name == "finish_reason":
            piece.finish_reason = values[0].decode()
        elif tensor.name == "prompt_tokens":
            piece.prompt_tokens = int(values[0])
        elif tensor.name == "completion_tokens":
            piece.completion_tokens = int(values[0])
        elif tensor.name == "logprobs":
            piece.logprobs = json.loads(values[0])
    return piece


# --------------------------------------------------------------------------------------- errors


def openai_error(error: NaiadError) -> Reply:
    status = HTTP_STATUS.get(error.status, 400)
    return Reply(status, _encoder.encode(error_body(error)))


def error_body(error: NaiadError) -> Body:
    status = HTTP_STATUS.get(error.status, 400)
    kind = {404: "not_found_error", 500: "internal_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": None,
                      "code": "model_not_found" if status == 404 else None}}


