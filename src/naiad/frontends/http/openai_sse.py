"""`stream: true`: the server-sent events of one completions or chat call, `data: {...}` chunks of
its choices interleaved as they come, each choice's finish chunk, the usage chunk when asked
(`stream_options.include_usage`), then `data: [DONE]`. Tool calls and reasoning are split out of
the text as it streams (openai_tools.py, reasoning.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import msgspec

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, NaiadError
from naiad.frontends.http.openai_answers import Body, Choice, error_body, response_piece
from naiad.frontends.http.openai_tools import CallWatch, HeldText
from naiad.frontends.http.reasoning import ReasoningSplitter
from naiad.frontends.http.reply import SSE_CONTENT_TYPE, Reply, StreamReply
from naiad.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from naiad.frontends.http.openai import _Call

DONE = b"data: [DONE]\n\n"

_encoder = msgspec.json.Encoder()


async def stream_reply(server: InferenceServer, call: _Call) -> Reply:
    events = Events(server, call)
    try:
        # The backend validates before scheduling: a bad setting is still an ordinary error reply.
        await events.start()
    except BaseException:
        await events.aclose()
        raise
    return StreamReply(200, events, SSE_CONTENT_TYPE)


#: one response of choice `index`, or None when its stream ended, or the exception it raised
_Item = tuple[int, InferResponse | BaseException | None]


class Events:
    """The SSE body: a task per choice feeds one queue, so that the choices' chunks interleave
    as they come; each choice's finish_reason chunk, then the usage chunk when asked, then
    `[DONE]`."""

    def __init__(self, server: InferenceServer, call: _Call) -> None:
        self.call = call
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.tasks = [asyncio.ensure_future(self._pump(server, index, request))
                      for index, request in enumerate(call.requests)]
        self.first: list[_Item] = []
        self._body = self._events()

    async def _pump(self, server: InferenceServer, index: int, request: InferRequest) -> None:
        responses = server.stream(request)
        try:
            async for response in responses:
                self.queue.put_nowait((index, response))
            self.queue.put_nowait((index, None))
        except Exception as error:  # handed over to the SSE body (cancellation is not an Exception)
            self.queue.put_nowait((index, error))

    async def start(self) -> None:
        """Wait for every choice's first response; the first error raises (before the 200)."""
        started: set[int] = set()
        while len(started) < len(self.tasks):
            index, item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item if isinstance(item, NaiadError) else InternalError(str(item))
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
            index, item = pending.pop(0) if pending else await self.queue.get()
            if item is None:
                open_choices -= 1
                continue
            try:
                if isinstance(item, BaseException):
                    raise item if isinstance(item, NaiadError) else InternalError(str(item))
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
        # Cancelling a pump closes its server.stream, which marks the request cancelled: a client
        # that leaves stops the engine.
        await self._body.aclose()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def sse(value: Body) -> bytes:
    return b"data: " + _encoder.encode(value) + b"\n\n"
