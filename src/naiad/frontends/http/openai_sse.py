"""`stream: true`: the server-sent events of one completions or chat call, `data: {...}` chunks of
its choices interleaved as they come, each choice's finish chunk, the usage chunk when asked
(`stream_options.include_usage`), then `data: [DONE]`. Tool calls and reasoning are split out of
the text as it streams (openai_tools.py, reasoning.py)."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING

import msgspec

from naiad.core.mailbox import Mailbox
from naiad.core.server import InferenceServer
from naiad.errors import InternalError, NaiadError
from naiad.frontends.http.openai_answers import Body, Choice, error_body, response_piece
from naiad.frontends.http.openai_tools import CallWatch, HeldText
from naiad.frontends.http.reasoning import ReasoningSplitter
from naiad.frontends.http.reply import SSE_CONTENT_TYPE, Reply, StreamReply
from naiad.types import InferResponse

if TYPE_CHECKING:
    from naiad.frontends.http.openai import _Call

DONE = b"data: [DONE]\n\n"

_encoder = msgspec.json.Encoder()


async def stream_reply(server: InferenceServer, call: _Call) -> Reply:
    # The backend validates before scheduling: a bad setting is still an ordinary error reply.
    events = Events(server, call)
    try:
        await events.start()
    except BaseException:
        await events.aclose()
        raise
    return StreamReply(200, events, SSE_CONTENT_TYPE)


#: one response of choice `index`, or None after its final one
_Item = tuple[int, InferResponse | None]


class Events:
    """The SSE body: every choice's responses come to one mailbox, so that the choices' chunks
    interleave as they come; each choice's finish_reason chunk, then the usage chunk when asked,
    then `[DONE]`. The responses go straight from the server's sinks to the mailbox, with no
    task and second queue per choice in between."""

    def __init__(self, server: InferenceServer, call: _Call) -> None:
        self.call = call
        self.mailbox: Mailbox[_Item] = Mailbox()
        self.cancels: list[Callable[[], None]] = []
        try:
            for index, request in enumerate(call.requests):
                self.cancels.append(server.stream_soon(request, functools.partial(self._put, index)))
        except BaseException as error:
            self._cancel()
            if isinstance(error, NaiadError) or not isinstance(error, Exception):
                raise
            raise InternalError(str(error)) from error
        self.first: list[_Item] = []
        self._body = self._events()

    def _put(self, index: int, response: InferResponse) -> None:
        self.mailbox.put((index, response))
        if response.final:
            self.mailbox.put((index, None))

    def _cancel(self) -> None:
        # Cancelling marks the requests cancelled: a client that leaves stops the engine.
        for cancel in self.cancels:
            cancel()

    async def start(self) -> None:
        """Wait for every choice's first response; the first error raises (before the 200)."""
        started: set[int] = set()
        while len(started) < len(self.cancels):
            index, item = await self.mailbox.get()
            if item is not None and item.error is not None:
                response_piece(item)
            started.add(index)
            self.first.append((index, item))

    async def _events(self) -> AsyncGenerator[bytes, None]:
        call = self.call
        choices = [Choice() for _ in call.requests]
        splitters = [ReasoningSplitter(call.thinks_first) for _ in choices] if call.thinks_first is not None else None
        watches = None
        if call.tools is not None:  # forced calls: all held (a JSON array); auto: from a possible call on
            watches = [CallWatch(call.tools) if call.tools.forced is None else HeldText(call.tools) for _ in choices]
        open_choices = len(choices)
        pending = list(self.first)
        while open_choices:
            index, item = pending.pop(0) if pending else await self.mailbox.get()
            if item is None:
                open_choices -= 1
                continue
            try:
                piece = response_piece(item)
            except NaiadError as error:  # after the 200 is sent, an error can only be an event
                yield sse(error_body(error))
                return
            choice = choices[index]
            offset = choice.offset
            choice.add(piece)
            choice.offset += sum(len(entry["token"]) for entry in piece.logprobs)
            reasoning, text = "", piece.text
            if splitters is not None:
                reasoning, text = splitters[index].push(piece.text, final=bool(piece.finish_reason))
            finish_reason = piece.finish_reason
            if watches is not None:  # text that may hold a call waits until the calls can be found
                text = watches[index].push(text)
                if finish_reason:
                    content, calls = watches[index].finish()
                    if calls:
                        if text or piece.logprobs:
                            yield sse(call.chunk(index, text, piece.logprobs, offset, reasoning=reasoning))
                            text, reasoning, piece.logprobs = "", "", []
                        yield sse(call.tool_calls_chunk(index, content, calls))
                        finish_reason = "tool_calls"
                    else:
                        text += content or ""
            if text or reasoning or piece.logprobs:
                yield sse(call.chunk(index, text, piece.logprobs, offset, reasoning=reasoning))
            if finish_reason:
                yield sse(call.chunk(index, "", [], 0, finish_reason, timings=choice.timings))
        if call.include_usage:
            yield sse(call.usage_chunk(choices))
        yield DONE

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body

    async def aclose(self) -> None:
        await self._body.aclose()
        self._cancel()


def sse(value: Body) -> bytes:
    return b"data: " + _encoder.encode(value) + b"\n\n"
