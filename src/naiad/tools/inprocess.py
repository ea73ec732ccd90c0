"""`naiad bench --in-process`: a naiad server in this process, called without a network.

The one part of the client tools that imports the server (through `naiad.core.server`, as a
frontend does): requests go straight to `InferenceServer.infer_soon`, so what is measured is the
core alone — scheduling, the hop to the model and back — with no protocol parsing. It plugs into
the load-generation core as another `Target`; `naiad.cli` wires it (the tools themselves never
import it, an import-linter contract).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.errors import NaiadError
from naiad.tools.loadgen.data import Entry
from naiad.tools.loadgen.kserve import ShmPlacement
from naiad.tools.loadgen.target import Bodies, Done, Target, TargetError
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor


class InProcessSlot:
    """One request at a time, submitted to the server's core on the event loop."""

    __slots__ = ("bodies", "done", "next", "server", "t0")

    def __init__(self, server: InferenceServer, bodies: list[Any], done: Done) -> None:
        self.server, self.bodies, self.done = server, bodies, done
        self.next = 0
        self.t0 = 0

    def send(self, t0: int = 0) -> None:
        self.t0 = t0 or time.monotonic_ns()
        model, version, inputs, outputs = self.bodies[self.next]
        self.next = (self.next + 1) % len(self.bodies)
        try:
            self.server.infer_soon(InferRequest(model, version, inputs, outputs), self._answer)
        except NaiadError as error:
            self.done(self, False, time.monotonic_ns() - self.t0, str(error))

    def _answer(self, response: InferResponse) -> None:
        latency = time.monotonic_ns() - self.t0
        if response.error is None:
            self.done(self, True, latency, "")
        else:
            self.done(self, False, latency, str(response.error))

    def close(self) -> None:
        pass


class InProcessTarget(Target):
    """A started InferenceServer, driven directly."""

    protocol = "in-process"

    def __init__(self, server: InferenceServer) -> None:
        self.server = server
        self.slots: list[InProcessSlot] = []

    def encode(self, model: str, version: str, entry: Entry, datatypes: dict[str, str], outputs: list[str],
               shm: ShmPlacement | None = None) -> Any:
        if shm is not None:
            raise TargetError("--in-process takes no shared memory: tensors are already in this process")
        inputs = [Tensor(name, DataType(datatypes[name]), tuple(array.shape), array) for name, array in entry.items()]
        return (model, int(version) if version else None, inputs, [RequestedOutput(name) for name in outputs])

    async def open_slots(self, count: int, bodies: Bodies, done: Done) -> list[Any]:
        opened = [InProcessSlot(self.server, bodies(len(self.slots) + i), done) for i in range(count)]
        self.slots += opened
        return opened

    async def close_slots(self) -> None:
        self.slots = []

    async def close(self) -> None:
        self.slots = []
        await asyncio.get_running_loop().run_in_executor(None, self.server.stop)

    def _version(self, version: str) -> int | None:
        return int(version) if version else None

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        try:
            return self.server.model_config(model, self._version(version))
        except NaiadError as error:
            raise TargetError(str(error)) from None

    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        try:
            return self.server.statistics(model, self._version(version))
        except NaiadError:
            return None

    async def load_model(self, model: str, config_json: str | None = None) -> None:
        parameters = {"config": config_json} if config_json is not None else {}
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.server.load_model, model, parameters)
        except NaiadError as error:
            raise TargetError(str(error)) from None

    async def register_shm(self, name: str, key: str, byte_size: int) -> None:
        raise TargetError("--in-process takes no shared memory")

    async def unregister_shm(self, name: str) -> None:
        return None


async def start(args: argparse.Namespace) -> InProcessTarget:
    """Serve `args.model_repository` (explicit control, `args.model` loaded) in this process."""
    from pathlib import Path

    options = ServerOptions(model_repositories=tuple(Path(r) for r in args.model_repository),
                            model_control_mode="explicit", load_models=(args.model,))
    loop = asyncio.get_running_loop()
    server = InferenceServer(options, loop=loop)  # model processes answer on this loop
    try:
        await loop.run_in_executor(None, server.start)
    except NaiadError as error:
        raise TargetError(f"in-process server: {error}") from None
    return InProcessTarget(server)

