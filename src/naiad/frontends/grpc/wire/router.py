"""HTTP/2 `:path` → the servicer method that answers it, from the services' own descriptors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from naiad.frontends.grpc.wire.headers import Headers

#: Checks a call's headers: None lets it in, else the (grpc-status, message) it is refused with.
Admission = Callable[[Headers], "tuple[int, str] | None"]
#: Answers a unary call without a task of its own when it can (see Route.soon).
Soon = Callable[[Any, Any], bool]


@dataclass(frozen=True, slots=True)
class Route:
    """One RPC: how to parse its request and which coroutine answers it."""

    name: str
    request_type: Any  # a protobuf message class
    handler: Callable[..., Any]
    client_streaming: bool
    server_streaming: bool
    # run on a call's headers before any of its body is read (access control: --auth-token...)
    admit: Admission | None = None
    # A unary method's synchronous front: given the parsed request and the call, True when it
    # took the call (it answers later through `call.answer` / `call.finish` on the event loop),
    # False to run `handler` as a task as usual. Saves the hot path a task and its coroutines.
    soon: Soon | None = None


def routes(services: list[tuple[ServiceDescriptor, object]],
           admission: dict[str, Admission] | None = None) -> dict[bytes, Route]:
    """Every method of every (descriptor, servicer) pair, by its path `/package.Service/Method`;
    `admission` maps a method name to the check its calls pass at their headers. A servicer's
    `soon_handlers()`, where it has one, maps unary method names to their `Route.soon`."""
    table: dict[bytes, Route] = {}
    checks = admission or {}
    for descriptor, servicer in services:
        soon: dict[str, Soon] = servicer.soon_handlers() if hasattr(servicer, "soon_handlers") else {}
        for method in descriptor.methods:
            path = f"/{descriptor.full_name}/{method.name}".encode()
            unary = not (method.client_streaming or method.server_streaming)
            table[path] = Route(method.name, GetMessageClass(method.input_type), getattr(servicer, method.name),
                                method.client_streaming, method.server_streaming, checks.get(method.name),
                                soon.get(method.name) if unary else None)
    return table
