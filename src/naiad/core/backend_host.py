"""The server's side of the backend contract (`naiad.backends.base.Host`): what backends call
back into (BLS requests, model control from Python models) and the event loop's watches."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from naiad.errors import InvalidArgument
from naiad.observability.custom_metrics import CustomMetrics
from naiad.scheduling.base import ResponseSink
from naiad.types import InferRequest

if TYPE_CHECKING:
    from naiad.core.server import InferenceServer

_LOOP_CALL_TIMEOUT_S = 5.0  # a loop that does not run our call by then is shutting down
BLS_DECOUPLED_ERROR = "the model is decoupled: call it with exec(decoupled=True)"


class BackendHost:
    """What backends call back into: BLS requests and model control from Python models."""

    def __init__(self, server: InferenceServer) -> None:
        self._server = server

    def submit(self, request: InferRequest, sink: ResponseSink, decoupled: bool) -> Callable[[], None]:
        job = self._server._submit(request, sink, None if decoupled else BLS_DECOUPLED_ERROR)

        return job.cancel

    def control(self, op: str, args: list[Any]) -> Any:
        server = self._server
        if op == "load_model":
            name, config, files = args
            parameters: dict[str, Any] = {f"file:{path}": data for path, data in (files or {}).items()}
            if config:
                parameters["config"] = config
            server.load_model(name, parameters)
            return None
        if op == "unload_model":
            name, unload_dependents = args
            server.unload_model(name, {"unload_dependents": unload_dependents})
            return None
        if op == "is_model_ready":
            name, version = args
            return server.model_ready(name, int(version) if version else None)
        raise InvalidArgument(f"unknown model control operation '{op}'")

    def backend_config(self, backend: str) -> dict[str, str]:
        return self._server.options.backend_config.get(backend, {})

    def custom_metrics(self) -> CustomMetrics:
        return self._server.custom_metrics

    def call_soon(self, callback: Callable[[], None]) -> bool:
        loop = self._server.loop
        if loop is None or threading.get_ident() != self._server.loop_thread:
            return False
        loop.call_soon(callback)
        return True

    def watch(self, fd: int, on_readable: Callable[[], None]) -> Callable[[], None] | None:
        loop = self._server.loop
        if loop is None or loop.is_closed():
            return None
        return _watch(loop, fd, on_readable, loop.add_reader, loop.remove_reader)

    def watch_writable(self, fd: int, on_writable: Callable[[], None]) -> Callable[[], None] | None:
        loop = self._server.loop
        if loop is None or loop.is_closed():
            return None
        return _watch(loop, fd, on_writable, loop.add_writer, loop.remove_writer)


def _watch(loop: asyncio.AbstractEventLoop, fd: int, callback: Callable[[], None],
           add: Callable[..., Any], remove_watch: Callable[[int], Any]) -> Callable[[], None]:
    """`add(fd, callback)` on the loop, and the function that undoes it (see Host.watch)."""
    _on_loop(loop, add, fd, callback)
    watching = [True]  # read and written on the loop's thread only

    def remove() -> None:
        # Once: a second remove queued by another thread may run after the first caller
        # closed `fd` and the loop reused its number for a client's connection.
        if watching[0]:
            watching[0] = False
            remove_watch(fd)

    def stop() -> None:
        if not loop.is_closed():
            _on_loop(loop, remove)

    return stop


def _on_loop(loop: asyncio.AbstractEventLoop, call: Callable[..., Any], *args: Any) -> None:
    """Run `call` on the loop's thread and wait for it (at once when that is this thread): the
    caller may close the descriptor next, and its number must not be reused while watched."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        call(*args)
        return
    done = threading.Event()

    def run() -> None:
        try:
            call(*args)
        finally:
            done.set()

    loop.call_soon_threadsafe(run)
    done.wait(_LOOP_CALL_TIMEOUT_S)
