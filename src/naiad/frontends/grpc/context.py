"""What the servicer needs from a call: the part of grpc.aio.ServicerContext it uses. grpcio's
context has it, and so does naiad's own transport's `wire.call.Call`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

import grpc


class CallContext(Protocol):
    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...

    async def write(self, message: Any) -> None: ...

    def set_compression(self, compression: grpc.Compression) -> None: ...

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]]) -> None: ...


async def compress(context: CallContext, algorithm: grpc.Compression) -> None:
    """Compress this call's responses. grpc.aio applies set_compression only when the initial
    metadata goes out after it, so send that metadata now (an empty set)."""
    context.set_compression(algorithm)
    await context.send_initial_metadata(())
