"""GRPCInferenceService (Triton's gRPC API) on the core: one coroutine per RPC.

Every RPC answers with the texts the HTTP frontend gives and maps errors to gRPC status codes
as Triton does (SPEC §1.2, the table is in `status.py`). The servicer runs unchanged on either
transport (naiad's own HTTP/2, or grpcio's server): it needs only a `CallContext`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from naiad.core.server import InferenceServer
from naiad.errors import InvalidArgument, NaiadError
from naiad.frontends import shared_memory as shm
from naiad.frontends.grpc import infer, messages
from naiad.frontends.grpc.codec import encode_infer_response
from naiad.frontends.grpc.context import CallContext, compress
from naiad.frontends.grpc.parameters import parse_version
from naiad.frontends.grpc.status import as_naiad_error, grpc_code
from naiad.frontends.grpc.stream import StreamSession
from naiad.types import InferResponse

log = logging.getLogger(__name__)

Request = TypeVar("Request")
Response = TypeVar("Response")
Context = CallContext
Method = Callable[[Any, Request, Context], Awaitable[Response]]



def rpc(method: Method[Request, Response]) -> Method[Request, Response]:
    """Turn a NaiadError into the RPC's gRPC status, and anything else into INTERNAL."""

    @functools.wraps(method)
    async def call(self: Any, request: Request, context: Context) -> Response:
        try:
            return await method(self, request, context)
        except NaiadError as error:
            code, message = grpc_code(error.status), error.message
        except Exception:
            log.exception("unhandled error in %s", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, "internal server error"
        await context.abort(code, message)  # raises: ends the call with the status

    return call


class GrpcInferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The servicer: health, metadata, inference, repository, statistics, shared memory, logging."""

    def __init__(self, server: InferenceServer, forward_pattern: str = "",
                 compression: grpc.Compression | None = None) -> None:
        self.server = server
        self.forward_pattern = forward_pattern
        self.compression = compression  # for inference responses only, as Triton

    # -- health and metadata -----------------------------------------------------------------

    @rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.server.is_live())

    @rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server.is_ready())

    @rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        ready = self.server.model_ready(request.name, self._version(request.name, request.version, False))
        return pb.ModelReadyResponse(ready=ready)

    @rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: Context) -> pb.ServerMetadataResponse:
        return messages.server_metadata(self.server.metadata())

    @rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        return messages.model_metadata(self.server.model_metadata(request.name,
                                                                  self._version(request.name, request.version)))

    @rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        config = self.server.model_config_message(request.name, self._version(request.name, request.version))
        return pb.ModelConfigResponse(config=config)

    @rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: Context) -> pb.ModelStatisticsResponse:
        version = self._version(request.name, request.version) if request.name else parse_version(request.version)
        return messages.statistics(self.server.statistics(request.name or None, version))

    def _version(self, name: str, text: str, loaded_only: bool = True) -> int | None:
        """A version string, or a version label of the model (docs/version_labels.md); a string
        that is neither keeps Triton's error."""
        try:
            return parse_version(text)
        except InvalidArgument as error:
            try:
                labelled = text in self.server.version_labels(name)["labels"]
            except NaiadError:  # an unknown model: the version string's error comes first, as before
                labelled = False
            if not labelled:
                raise error from None
            return self.server.label_version(name, text, loaded_only)

    # -- inference ---------------------------------------------------------------------------

    @rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        if self.compression is not None:
            await compress(context, self.compression)
        tracer = self.server.tracer
        if not tracer.active:
            decoded = infer.decode(request, context, self.forward_pattern)
            response, written = await infer.infer(self.server, decoded)
            return encode_infer_response(response, written)
        # Traced requests carry their GRPC_RECV stamps in and end once their reply is written.
        decoded = infer.decode(request, context, self.forward_pattern, tracing=True)
        decoded.trace_held = True
        opened, received = getattr(context, "opened_ns", 0), getattr(context, "received_ns", 0)
        if opened and received:
            decoded.trace_stamps = [("GRPC_RECV_START", opened), ("GRPC_RECV_END", received)]
        try:
            response, written = await infer.infer(self.server, decoded)
        except BaseException:
            if decoded.trace is not None:
                tracer.finish(decoded.trace)  # no reply to wait for: the error ends the call
            raise
        trace = decoded.trace
        if trace is not None:
            if hasattr(context, "on_sent"):
                context.on_sent = lambda start, end: tracer.finish_sent(trace, "GRPC", (start, end))
            else:
                tracer.finish(trace)
        return encode_infer_response(response, written)

    def soon_handlers(self) -> dict[str, Callable[[Any, Any], bool]]:
        """Unary methods naiad's transport may answer without a task (wire.router.Route.soon)."""
        return {"ModelInfer": self.model_infer_soon}

    def model_infer_soon(self, request: pb.ModelInferRequest, call: Any) -> bool:
        """ModelInfer without a task, for the common request: no response compression, tracing
        off (those take `ModelInfer`, returning False). Same answers as it. Tensors in shared
        memory keep their regions open, even if a client unregisters them, until the outputs
        are written or the call is cancelled (`shm.begin`)."""
        if self.compression is not None or self.server.tracer.active:
            return False
        held = None
        try:
            decoded = infer.decode(request, call, self.forward_pattern)
            if shm.uses_shared_memory(decoded):
                held = shm.begin(decoded, self.server.shared_memory)

            def answered(response: InferResponse) -> None:
                try:
                    if response.error is not None:
                        raise as_naiad_error(response.error)
                    reply = (encode_infer_response(response) if held is None else
                             encode_infer_response(response, held.write_outputs(response)))
                except NaiadError as error:
                    call.finish(grpc_code(error.status), error.message)
                    return
                except Exception:
                    log.exception("unhandled error in ModelInfer")
                    call.finish(grpc.StatusCode.INTERNAL, "internal server error")
                    return
                finally:
                    if held is not None:
                        held.release()
                call.answer(reply)

            cancel = self.server.infer_soon(decoded, answered, infer.DECOUPLED_ERROR)
        except NaiadError as error:
            call.finish(grpc_code(error.status), error.message)
            if held is not None:
                held.release()
            return True
        except Exception:
            log.exception("unhandled error in ModelInfer")
            call.finish(grpc.StatusCode.INTERNAL, "internal server error")
            if held is not None:
                held.release()
            return True
        if not call.closed:  # not answered already (a cache hit, an early refusal)
            call.on_cancel = cancel if held is None else shm.cancelling(cancel, held)
        return True

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: Context) -> None:
        session = StreamSession(self.server, context, self.forward_pattern, self.compression)
        await session.run(request_iterator)

    # -- model repository --------------------------------------------------------------------

    @rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: Context) -> pb.RepositoryIndexResponse:
        return messages.repository_index(self.server.repository_index(request.ready))

    @rpc
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Context) -> pb.RepositoryModelLoadResponse:
        parameters = messages.repository_parameters(request.parameters)
        await _blocking(self.server.load_model, request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Context) -> pb.RepositoryModelUnloadResponse:
        parameters = messages.repository_parameters(request.parameters)
        await _blocking(self.server.unload_model, request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    # -- system and CUDA shared memory ---------------------------------------------------------

    @rpc
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Context) -> pb.SystemSharedMemoryStatusResponse:
        return messages.shm_status(self.server.shared_memory.status(request.name or None))

    @rpc
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Context) -> pb.SystemSharedMemoryRegisterResponse:
        if not request.name:
            raise InvalidArgument("'region name' is necessary to register system shared memory region")
        self.server.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Context) -> pb.SystemSharedMemoryUnregisterResponse:
        self.server.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: Context) -> pb.CudaSharedMemoryStatusResponse:
        return messages.cuda_status(shm.cuda_status(self.server.shared_memory, request.name or None))

    @rpc
    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: Context) -> pb.CudaSharedMemoryRegisterResponse:
        raise shm.cuda_register_error(request.name)

    @rpc
    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: Context) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # no CUDA region can have been registered

    # -- trace and logging -------------------------------------------------------------------

    @rpc
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Context) -> pb.TraceSettingResponse:
        model = request.model_name or None
        return messages.trace_settings(self.server.trace_settings(model, messages.trace_changes(request.settings)))

    @rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Context) -> pb.LogSettingsResponse:
        if not request.settings:
            return messages.log_settings(self.server.logging.get())
        return messages.log_settings(self.server.logging.update(messages.log_changes(request.settings)))


async def _blocking(call: Callable[..., None], *args: Any) -> None:
    """Run a blocking core call (model load / unload) off the event loop."""
    await asyncio.get_running_loop().run_in_executor(None, call, *args)
