"""vLLM's `POST /tokenize` and `POST /detokenize` for "llm" models, answered by the model's own
tokenizer in the llm backend (request parameters `tokenize` / `detokenize`): no generation runs,
and the ids are the ones generation would see for the same prompt (chat template included)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError
from naiad.frontends.http.openai import llm_model, messages_json, parse_body, template_controls, text_input
from naiad.frontends.http.openai_answers import openai_error, response_piece
from naiad.frontends.http.openai_tasks import check_fields
from naiad.frontends.http.reply import Headers, Reply
from naiad.frontends.http.routes import Route
from naiad.types import InferRequest, InferResponse

_encoder = msgspec.json.Encoder()
_TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_generation_prompt", "continue_final_message",
                    "chat_template_kwargs", "return_token_strs"}


async def tokenize(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    """vLLM's `POST /tokenize`: a `prompt`, or chat `messages` with the template controls, to the
    token ids generation would see (`{"count", "max_model_len", "tokens", "token_strs"}`;
    `token_strs`, the tokens' vocabulary entries, with `return_token_strs` true, else null)."""
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))
        model = llm_model(server, document.get("model"))
        check_fields(document, _TOKENIZE_FIELDS)
        parameters: dict[str, Any] = {"tokenize": True}
        strs = document.get("return_token_strs")
        if strs is not None and not isinstance(strs, bool):
            raise InvalidArgument("'return_token_strs' must be true or false")
        if strs:
            parameters["return_token_strs"] = True
        if "messages" in document:
            if "prompt" in document:
                raise InvalidArgument("give either 'prompt' or 'messages'")
            text = messages_json(document["messages"])
            parameters.update(apply_chat_template=True, **template_controls(document))
        elif isinstance(document.get("prompt"), str):
            text = document["prompt"]
        else:
            raise InvalidArgument("'prompt' must be a string (or give 'messages')")
        answer = await _tokens(server, InferRequest(model, None, [text_input(text)], parameters=parameters))
        tokens = json.loads(answer.parameters["token_ids"])
        token_strs = json.loads(answer.parameters["token_strs"]) if strs else None
        return Reply(200, _encoder.encode({"count": len(tokens), "max_model_len": answer.parameters["max_model_len"],
                                           "tokens": tokens, "token_strs": token_strs}))
    except NaiadError as error:
        return openai_error(error)


async def detokenize(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    """vLLM's `POST /detokenize`: `tokens` (ids) to `{"prompt": text}`."""
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))
        model = llm_model(server, document.get("model"))
        check_fields(document, {"model", "tokens"})
        tokens = document.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidArgument("'tokens' must be an array of token ids")
        parameters = {"detokenize": True, "token_ids": json.dumps(tokens)}
        answer = await _tokens(server, InferRequest(model, None, [text_input("")], parameters=parameters))
        return Reply(200, _encoder.encode({"prompt": response_piece(answer).text}))
    except NaiadError as error:
        return openai_error(error)


async def _tokens(server: InferenceServer, request: InferRequest) -> InferResponse:
    """The backend's one answer to a tokenize or detokenize request."""
    answer: InferResponse | None = None
    async for response in server.stream(request):
        response_piece(response)  # an error raises
        if answer is None and response.outputs:
            answer = response
    if answer is None:
        raise InternalError(f"model '{request.model_name}' sent no answer")
    return answer
