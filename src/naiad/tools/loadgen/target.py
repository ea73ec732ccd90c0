"""Where requests go: a KServe V2 server over HTTP/1.1 or gRPC (naiad, Triton, any other).

A target opens *slots*: each carries one request at a time (`send`), and reports each answer to
the `Done` callback with its latency. HTTP slots are keep-alive connections; gRPC slots share
connections (`streams_per_connection` calls in flight on each). By default they share as few
connections as the server's stream limit allows, as perf_analyzer's gRPC client shares one
channel: the server then reads and answers many calls per system call, and a load generator with
a connection per call would measure a different, slower server. A target also makes the control
calls the tools need: the model's config, its statistics, shared-memory regions, repository loads.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from naiad.tools.loadgen import h2, http1, kserve
from naiad.tools.loadgen.data import Entry
from naiad.tools.loadgen.kserve import ShmPlacement

#: done(slot, ok, latency_ns, error) — called on the event loop once per request.
Done = Callable[[Any, bool, int, str], None]
#: bodies(slot_index) -> the encoded requests that slot sends in turn.
Bodies = Callable[[int], list[bytes]]

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


class TargetError(RuntimeError):
    """The server refused a control call or cannot be reached; the message says which and why."""


def parse_url(url: str, protocol: str) -> tuple[str, int]:
    """`host:port`, `http://host:port` or `host` (the protocol's default port) into (host, port)."""
    parts = urlsplit(url if "://" in url else f"//{url}")
    if parts.hostname is None:
        raise TargetError(f"cannot read a host from '{url}'")
    return parts.hostname, parts.port or DEFAULT_PORTS[protocol]


class Target(ABC):
    """A server to send requests to, and to ask about its models."""

    protocol: str

    @abstractmethod
    def encode(self, model: str, version: str, entry: Entry, datatypes: dict[str, str], outputs: list[str],
               shm: ShmPlacement | None = None) -> bytes:
        """One request, encoded once, in this target's wire format."""

    @abstractmethod
    async def open_slots(self, count: int, bodies: Bodies, done: Done) -> list[Any]:
        """`count` more slots (indexes continue from those already open)."""

    @abstractmethod
    async def close_slots(self) -> None:
        """Close every slot (the control connection stays)."""

    async def close(self) -> None:
        """Close every slot and the control connection."""
        await self.close_slots()
        self.control.close()  # type: ignore[attr-defined]

    @abstractmethod
    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        """The served config as JSON (`GET /v2/models/M/config`)."""

    @abstractmethod
    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        """The statistics extension's answer, or None when the server has none."""

    @abstractmethod
    async def load_model(self, model: str, config_json: str | None = None) -> None:
        """Repository load (explicit model control), with a config override when given."""

    @abstractmethod
    async def register_shm(self, name: str, key: str, byte_size: int) -> None:
        """Register a system shared memory region."""

    @abstractmethod
    async def unregister_shm(self, name: str) -> None:
        """Unregister a region (no error when it is not registered)."""


# ---------------------------------------------------------------------------------------------- HTTP


class HttpSlot(http1.HttpConnection):
    """A keep-alive connection that sends its bodies in turn and times each answer."""

    def __init__(self, target: HttpTarget, index: int, bodies: list[bytes], done: Done) -> None:
        super().__init__(_unused_response)
        self.target, self.index, self.bodies, self.done = target, index, bodies, done
        self.next = 0
        self.t0 = 0
        self.broken = False

    def send(self, t0: int = 0) -> None:
        self.t0 = t0 or time.monotonic_ns()
        if self.broken or not self.open:
            asyncio.get_running_loop().create_task(self._reopen_and_send())
            return
        body = self.bodies[self.next]
        self.next = (self.next + 1) % len(self.bodies)
        self.pending = True
        self.transport.write(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        latency = time.monotonic_ns() - self.t0
        self.pending = False
        if not self._parser.should_keep_alive():
            self.broken = True
            self.close()
        status = self._status
        if status == 200:
            self.done(self, True, latency, "")
            return
        body = b"".join(self._body).decode(errors="replace")
        self._body = []
        self.done(self, False, latency, f"HTTP {status}: {_error_text(body)}")

    def _fail(self, why: str) -> None:
        self.pending = False
        self.broken = True
        self._body = []
        self.close()
        self.done(self, False, time.monotonic_ns() - self.t0, why)

    async def _reopen_and_send(self) -> None:
        t0 = self.t0
        try:
            await self.target.reopen(self)
        except TargetError as error:
            self.done(self, False, time.monotonic_ns() - t0, str(error))
            return
        self.send(t0)


def _unused_response(*_: Any) -> None:  # HttpSlot overrides on_message_complete
    raise AssertionError("unreachable")


def _error_text(body: str) -> str:
    try:
        return str(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        return body[:300]


class HttpTarget(Target):
    """A KServe V2 server over HTTP/1.1 (binary tensor extension)."""

    protocol = "http"

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = parse_url(url, "http")
        self.headers = headers or {}
        self.control = http1.HttpControl(self.host, self.port, self.headers)
        self.slots: list[HttpSlot] = []

    def encode(self, model: str, version: str, entry: Entry, datatypes: dict[str, str], outputs: list[str],
               shm: ShmPlacement | None = None) -> bytes:
        return kserve.http_infer(f"{self.host}:{self.port}", model, version, entry, datatypes, outputs, shm,
                                 self.headers)

    async def open_slots(self, count: int, bodies: Bodies, done: Done) -> list[Any]:
        loop = asyncio.get_running_loop()
        opened = []
        for _ in range(count):
            slot = HttpSlot(self, len(self.slots), bodies(len(self.slots)), done)
            try:
                await loop.create_connection(lambda s=slot: s, self.host, self.port)  # type: ignore[misc]
            except OSError as error:
                raise TargetError(f"cannot connect to {self.host}:{self.port}: {error.strerror or error}") from None
            self.slots.append(slot)
            opened.append(slot)
        return opened

    async def reopen(self, slot: HttpSlot) -> None:
        """A new connection for a slot whose server closed the last one."""
        slot.close()
        slot._parser = http1.httptools.HttpResponseParser(slot)
        slot.broken = False
        try:
            await asyncio.get_running_loop().create_connection(lambda: slot, self.host, self.port)
        except OSError as error:
            slot.broken = True
            raise TargetError(f"cannot reconnect to {self.host}:{self.port}: {error.strerror or error}") from None

    async def close_slots(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    missing_ok: bool = False) -> dict[str, Any] | None:
        raw = json.dumps(body).encode() if body is not None else b""
        status, answer = await self.control.request(method, path, raw)
        if status == 0:
            raise TargetError(f"{self.host}:{self.port}: {answer.decode(errors='replace')}")
        if status == 404 and missing_ok:
            return None
        if status != 200:
            raise TargetError(f"{method} {path}: HTTP {status}: {_error_text(answer.decode(errors='replace'))}")
        return json.loads(answer) if answer else {}

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        path = f"/v2/models/{quote(model)}"
        return f"{path}/versions/{quote(version)}" if version else path

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._call("GET", self._model_path(model, version) + "/config") or {}

    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        try:
            return await self._call("GET", self._model_path(model, version) + "/stats", missing_ok=True)
        except TargetError:
            return None

    async def load_model(self, model: str, config_json: str | None = None) -> None:
        body = {"parameters": {"config": config_json}} if config_json is not None else {}
        await self._call("POST", f"/v2/repository/models/{quote(model)}/load", body)

    async def register_shm(self, name: str, key: str, byte_size: int) -> None:
        await self._call("POST", f"/v2/systemsharedmemory/region/{quote(name)}/register",
                         {"key": key, "offset": 0, "byte_size": byte_size})

    async def unregister_shm(self, name: str) -> None:
        await self._call("POST", f"/v2/systemsharedmemory/region/{quote(name)}/unregister", {})


# ---------------------------------------------------------------------------------------------- gRPC

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


class GrpcSlot:
    """One call at a time on a shared HTTP/2 connection."""

    __slots__ = ("bodies", "conn", "done", "index", "next", "t0", "target")

    def __init__(self, target: GrpcTarget, index: int, bodies: list[bytes], done: Done) -> None:
        self.target, self.index, self.bodies, self.done = target, index, bodies, done
        self.conn: h2.H2Connection | None = None
        self.next = 0
        self.t0 = 0

    def send(self, t0: int = 0) -> None:
        self.t0 = t0 or time.monotonic_ns()
        conn = self.conn
        if conn is None or not conn.open or conn._next_id > h2.MAX_STREAM_ID:
            asyncio.get_running_loop().create_task(self._reopen_and_send())
            return
        body = self.bodies[self.next]
        self.next = (self.next + 1) % len(self.bodies)
        conn.call(self, INFER_PATH, body)

    async def _reopen_and_send(self) -> None:
        t0 = self.t0
        try:
            await self.target.reopen(self)
        except TargetError as error:
            self.done(self, False, time.monotonic_ns() - t0, str(error))
            return
        self.send(t0)


def _grpc_call_done(slot: GrpcSlot, ok: bool, error: str, _message: bytes) -> None:
    slot.done(slot, ok, time.monotonic_ns() - slot.t0, error)


class GrpcTarget(Target):
    """A KServe V2 server over gRPC (GRPCInferenceService), through the lean HTTP/2 client."""

    protocol = "grpc"

    def __init__(self, url: str, metadata: dict[str, str] | None = None, streams_per_connection: int = 0) -> None:
        self.host, self.port = parse_url(url, "grpc")
        self.metadata = metadata or {}
        # 0: the default, 100 per connection, the stream limit HTTP/2 recommends servers allow at
        # least (RFC 9113 6.5.2); naiad allows 128, gRPC servers by default more.
        self.streams_per_connection = streams_per_connection if streams_per_connection > 0 else 100
        self.control = h2.GrpcControl(self.host, self.port, self.metadata)
        self.slots: list[GrpcSlot] = []
        self.connections: list[h2.H2Connection] = []

    def encode(self, model: str, version: str, entry: Entry, datatypes: dict[str, str], outputs: list[str],
               shm: ShmPlacement | None = None) -> bytes:
        return h2.grpc_message(kserve.grpc_infer(model, version, entry, datatypes, outputs, shm))

    async def _connection(self) -> h2.H2Connection:
        try:
            conn = await h2.connect(self.host, self.port, _grpc_call_done, self.metadata)
        except h2.H2Error as error:
            raise TargetError(str(error)) from None
        self.connections.append(conn)
        return conn

    async def open_slots(self, count: int, bodies: Bodies, done: Done) -> list[Any]:
        opened = []
        for _ in range(count):
            index = len(self.slots)
            slot = GrpcSlot(self, index, bodies(index), done)
            if index % self.streams_per_connection == 0 or not self.connections:
                slot.conn = await self._connection()
            else:
                slot.conn = self.connections[-1]
            self.slots.append(slot)
            opened.append(slot)
        return opened

    async def reopen(self, slot: GrpcSlot) -> None:
        """Move every slot of a dead connection to a new one."""
        old = slot.conn
        conn = await self._connection()
        for other in self.slots:
            if other.conn is old:
                other.conn = conn

    async def close_slots(self) -> None:
        for conn in self.connections:
            conn.close()
        self.connections, self.slots = [], []

    async def _call(self, method: str, request: Any, response_type: Any) -> dict[str, Any]:
        try:
            raw = await self.control.call(method, request.SerializeToString())
        except h2.H2Error as error:
            raise TargetError(str(error)) from None
        message = response_type()
        message.ParseFromString(raw)
        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        answer = await self._call("ModelConfig", service_pb2.ModelConfigRequest(name=model, version=version),
                                  service_pb2.ModelConfigResponse)
        return dict(answer.get("config", {}))

    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        try:
            return await self._call("ModelStatistics", service_pb2.ModelStatisticsRequest(name=model, version=version),
                                    service_pb2.ModelStatisticsResponse)
        except TargetError:
            return None

    async def load_model(self, model: str, config_json: str | None = None) -> None:
        request = service_pb2.RepositoryModelLoadRequest(model_name=model)
        if config_json is not None:
            request.parameters["config"].string_param = config_json
        await self._call("RepositoryModelLoad", request, service_pb2.RepositoryModelLoadResponse)

    async def register_shm(self, name: str, key: str, byte_size: int) -> None:
        request = service_pb2.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size)
        await self._call("SystemSharedMemoryRegister", request, service_pb2.SystemSharedMemoryRegisterResponse)

    async def unregister_shm(self, name: str) -> None:
        await self._call("SystemSharedMemoryUnregister", service_pb2.SystemSharedMemoryUnregisterRequest(name=name),
                         service_pb2.SystemSharedMemoryUnregisterResponse)


def make_target(protocol: str, url: str, headers: dict[str, str] | None = None,
                streams_per_connection: int = 0) -> Target:
    """An HTTP or gRPC target for `url`."""
    if protocol == "http":
        return HttpTarget(url, headers)
    if protocol == "grpc":
        return GrpcTarget(url, headers, streams_per_connection)
    raise TargetError(f"unknown protocol '{protocol}' (http or grpc)")
