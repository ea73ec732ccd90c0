"""HTTP/2 `:path` → the servicer method that answers it, from the services' own descriptors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass


@dataclass(frozen=True, slots=True)
class Route:
    """One RPC: how to parse its request and which coroutine answers it."""

    name: str
    request_type: Any  # a protobuf message class
    handler: Callable[..., Any]
    client_streaming: bool
    server_streaming: bool


def routes(services: list[tuple[ServiceDescriptor, object]]) -> dict[bytes, Route]:
    """Every method of every (descriptor, servicer) pair, by its path `/package.Service/Method`."""
    table: dict[bytes, Route] = {}
    for descriptor, servicer in services:
        for method in descriptor.methods:
            path = f"/{descriptor.full_name}/{method.name}".encode()
            table[path] = Route(method.name, GetMessageClass(method.input_type), getattr(servicer, method.name),
                                method.client_streaming, method.server_streaming)
    return table
