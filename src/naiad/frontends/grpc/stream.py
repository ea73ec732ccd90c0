"""ModelStreamInfer: many requests in flight on one bidirectional stream.

Each request read from the stream runs as its own task, so a slow request never holds up the
ones behind it. Responses carry their request's id. As in Triton, the answers of non-decoupled
models are written in the order their requests arrived, while a decoupled model's responses are
written as they come. A request's error is sent as `error_message` and the stream stays open,
unless the client opened it with metadata `triton_grpc_error: true`: then the first error ends
the stream with a real gRPC status.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from naiad.core.server import InferenceServer
from naiad.errors import NaiadError
from naiad.frontends.grpc import infer
from naiad.frontends.grpc.codec import encode_infer_response
from naiad.frontends.grpc.context import CallContext, compress
from naiad.frontends.grpc.parameters import empty_final_response
from naiad.frontends.grpc.status import as_naiad_error, grpc_code
from naiad.types import InferResponse

log = logging.getLogger(__name__)

FINAL = "triton_final_response"
GRPC_ERROR_HEADER = "triton_grpc_error"
_DONE = object()  # queued once the client has half-closed and every request is answered
# Requests one stream may have running or answered-but-unwritten, and their bytes; past either
# the stream stops reading, so the transport's flow control holds the client back instead of
# memory growing (64 requests of 1 MiB each used to be 64 MiB per stream).
MAX_IN_FLIGHT = 64
MAX_IN_FLIGHT_BYTES = 16 << 20


class StreamSession:
    """One ModelStreamInfer call: reads requests, runs them concurrently, writes responses."""

    def __init__(self, server: InferenceServer, context: CallContext, forward_pattern: str,
                 compression: grpc.Compression | None) -> None:
        self.server = server
        self.context = context
        self.forward_pattern = forward_pattern
        self.compression = compression
        metadata = context.invocation_metadata() or ()
        self.grpc_errors = any(k == GRPC_ERROR_HEADER and v == "true" for k, v in metadata)
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.ordered: collections.deque[asyncio.Future[list[Any]]] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.reading = True
        self.in_flight_bytes = 0
        self.room = asyncio.Event()  # set whenever a request finishes or an answer is written

    async def run(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        """Serve the stream until the client half-closes and every answer is written."""
        if self.compression is not None:
            await compress(self.context, self.compression)
        reader = asyncio.create_task(self._read(requests))
        try:
            while (item := await self.outbox.get()) is not _DONE:
                if isinstance(item, NaiadError):
                    await self.context.abort(grpc_code(item.status), item.message)
                await self.context.write(item)
                self.room.set()
        finally:
            reader.cancel()
            for task in list(self.tasks):
                task.cancel()

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for message in requests:
                while self._occupancy() >= MAX_IN_FLIGHT or self.in_flight_bytes >= MAX_IN_FLIGHT_BYTES:
                    self.room.clear()
                    await self.room.wait()
                self._start(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the client broke the stream; answer what is in flight
            log.debug("stream read ended: %s", error)
        self.reading = False
        self._maybe_done()

    def _start(self, message: pb.ModelInferRequest) -> None:
        slot = None if self._decoupled(message) else self._reserve()
        size = message.ByteSize()
        self.in_flight_bytes += size
        task = asyncio.create_task(self._serve(message, slot, size))
        self.tasks.add(task)
        task.add_done_callback(self._finished)

    def _decoupled(self, message: pb.ModelInferRequest) -> bool:
        try:
            version = int(message.model_version) if message.model_version else None
            return self.server.is_decoupled(message.model_name, version)
        except (NaiadError, ValueError):
            return False  # the request fails in _serve, with the texts of the ordinary path

    def _reserve(self) -> asyncio.Future[list[Any]]:
        slot: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.ordered.append(slot)
        return slot

    async def _serve(self, message: pb.ModelInferRequest, slot: asyncio.Future[list[Any]] | None,
                     size: int) -> None:
        answers: list[Any] = []
        emit = answers.append if slot is not None else self.outbox.put_nowait
        try:
            request = infer.decode(message, self.context, self.forward_pattern)
            enable_empty_final = empty_final_response(message.parameters)
            async for response, written in infer.stream(self.server, request):
                answer = self._answer(message, response, written, slot is None, enable_empty_final)
                if answer is not None:
                    emit(answer)
        except NaiadError as error:
            emit(self._failure(error, _error_response(message)))
        except Exception as error:
            log.exception("stream request failed")
            emit(self._failure(as_naiad_error(error), _error_response(message)))
        finally:
            self.in_flight_bytes -= size
            if slot is not None and not slot.done():
                slot.set_result(answers)
                self._flush_ordered()

    def _answer(self, message: pb.ModelInferRequest, response: InferResponse, written: frozenset[str],
                decoupled: bool, enable_empty_final: bool) -> Any:
        """The message for one core response, or None for an empty final response nobody asked for."""
        if response.error is not None:
            failed = _error_response(message)
            failed.model_name = message.model_name
            failed.model_version = message.model_version
            failed.parameters[FINAL].bool_param = response.final
            return self._failure(as_naiad_error(response.error), failed)
        if decoupled and response.final and not response.outputs:
            if not enable_empty_final:
                return None
            empty = pb.ModelInferResponse(model_name=message.model_name, model_version=message.model_version,
                                          id=message.id)
            empty.parameters[FINAL].bool_param = True
            return pb.ModelStreamInferResponse(infer_response=empty)
        encoded = encode_infer_response(response, written)
        encoded.parameters[FINAL].bool_param = response.final
        return pb.ModelStreamInferResponse(infer_response=encoded)

    def _failure(self, error: NaiadError, response: pb.ModelInferResponse) -> Any:
        # With triton_grpc_error the error itself is queued: it ends the stream with its status.
        if self.grpc_errors:
            return error
        return pb.ModelStreamInferResponse(error_message=error.message, infer_response=response)

    def _flush_ordered(self) -> None:
        while self.ordered and self.ordered[0].done():
            for answer in self.ordered.popleft().result():
                self.outbox.put_nowait(answer)

    def _occupancy(self) -> int:
        """Requests running or waiting for their turn (`ordered`), plus answers not yet written."""
        return max(len(self.tasks), len(self.ordered)) + self.outbox.qsize()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.room.set()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self.reading and not self.tasks and not self.ordered:
            self.outbox.put_nowait(_DONE)


def _error_response(message: pb.ModelInferRequest) -> pb.ModelInferResponse:
    # Triton repeats the id so that the client knows which request failed.
    return pb.ModelInferResponse(id=message.id)
