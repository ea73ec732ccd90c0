"""The response cache: Triton's `--cache-config local,size=BYTES` with a model's
`response_cache { enable: true }`.

One `ResponseCache` (an LRU within a byte budget) is shared by every model, as Triton's local
cache is. Each version the cache serves gets a `ModelCache`: it answers a request whose key is
cached without queueing or computing, and stores the final response of a request it missed once
that response succeeds. The key hashes the model, the version, every input (name, datatype,
shape, bytes), the request parameters that can change a result and the outputs' classification
settings; frontend and scheduling details (priority, timeout, binary_data_output...) stay out of
it. Unlike Triton's key, each loaded version adds its own token, so a reload with new model files
never answers with results of the old ones.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.responses import ResponseBuilder
from naiad.observability.statistics import ModelStatistics
from naiad.scheduling.base import Job, ResponseSink
from naiad.types import InferRequest, InferResponse, Tensor

#: Request parameters that steer scheduling or the wire format, never the outputs: requests that
#: differ only in them share a cache entry.
NEUTRAL_PARAMETERS = frozenset({
    "priority", "timeout", "binary_data_output", "sequence_id", "sequence_start", "sequence_end",
    "triton_enable_empty_final_response",
})
#: What one entry costs beyond its tensors' bytes (key, bookkeeping), so that a budget of many
#: tiny entries is honest too.
ENTRY_OVERHEAD_BYTES = 64
_ENSEMBLE = "ensemble"
_generations = itertools.count(1)


def serves(config: mc.ModelConfig) -> bool:
    """Whether a model's config asks for the cache; the server must have one too. Top-level
    ensemble requests are never cached (Triton caches only their composing models)."""
    return bool(config.response_cache.enable and config.platform != _ENSEMBLE)


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """A response's outputs by name (read-only copies) and its parameters."""

    outputs: dict[str, Tensor]
    parameters: dict[str, Any]
    nbytes: int

    @classmethod
    def of(cls, response: InferResponse) -> CachedResponse:
        """Copy the outputs: a backend may hand back views of the request's own buffers, or
        arrays it reuses, and nothing may change a cached answer afterwards."""
        outputs = {}
        nbytes = ENTRY_OVERHEAD_BYTES
        for tensor in response.outputs:
            data = np.array(tensor.data, copy=True, order="C")
            data.flags.writeable = False
            outputs[tensor.name] = Tensor(tensor.name, tensor.datatype, tuple(tensor.shape), data)
            nbytes += _nbytes(data)
        return cls(outputs, dict(response.parameters), nbytes)


def _nbytes(data: np.ndarray) -> int:
    if data.dtype != object:
        return int(data.nbytes)
    return int(data.nbytes) + sum(len(item) if isinstance(item, bytes | str) else 0 for item in data.flat)


@dataclass(slots=True)
class CacheCounters:
    """What the cache did since it was made (for tests and logs; the per-model hit and miss
    figures are in each version's statistics)."""

    inserted: int = 0
    evicted: int = 0
    too_large: int = 0


class ResponseCache:
    """Least-recently-used entries within `capacity` bytes; safe to use from any thread."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"the response cache needs a positive size, got {capacity}")
        self.capacity = capacity
        self.size = 0  # bytes held by the entries
        self.counters = CacheCounters()
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()  # oldest use first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The entry under `key`, now the most recently used; None when there is none."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def insert(self, key: bytes, entry: CachedResponse) -> bool:
        """Store `entry` (replacing one under the same key), evicting the least recently used
        entries until it fits; an entry larger than the whole budget is not stored (False)."""
        with self._lock:
            if entry.nbytes > self.capacity:
                self.counters.too_large += 1
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= old.nbytes
            while self.size + entry.nbytes > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self.size -= evicted.nbytes
                self.counters.evicted += 1
            self._entries[key] = entry
            self.size += entry.nbytes
            self.counters.inserted += 1
            return True


def request_key(request: InferRequest, model: str, version: str, token: int = 0) -> bytes:
    """A SHA-256 of everything about `request` that decides its outputs (SHA-256: usually the
    fastest of hashlib's on CPUs with SHA extensions, and no client can forge a collision)."""
    digest = hashlib.sha256()
    _text(digest, model)
    _text(digest, version)
    digest.update(token.to_bytes(8, "little"))
    for tensor in sorted(request.inputs, key=_name):  # the order of inputs changes nothing
        _text(digest, tensor.name)
        _text(digest, tensor.datatype.value)
        digest.update(np.asarray(tensor.shape, dtype=np.int64).tobytes())
        _data(digest, tensor.data)
    for key in sorted(request.parameters):
        if key not in NEUTRAL_PARAMETERS:
            value = request.parameters[key]
            _text(digest, key)
            _text(digest, f"{type(value).__name__}:{value!r}")
    for output in sorted(request.outputs or (), key=_name):
        count = output.parameters.get("classification")
        if count:  # the only output parameter that changes an output (binary_data, shm do not)
            _text(digest, output.name)
            _text(digest, f"classification:{count!r}")
    return digest.digest()


def _name(item: Any) -> str:
    return str(item.name)


def _text(digest: Any, text: str) -> None:
    raw = text.encode()
    digest.update(len(raw).to_bytes(8, "little"))  # length-prefixed: "ab"+"c" differs from "a"+"bc"
    digest.update(raw)


def _data(digest: Any, data: np.ndarray) -> None:
    if data.dtype != object:
        digest.update(np.ascontiguousarray(data))  # the buffer itself, no copy (shape is hashed)
        return
    for item in data.flat:  # BYTES: each element length-prefixed
        raw = item if isinstance(item, bytes) else str(item).encode()
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)


@dataclass(slots=True)
class ModelCache:
    """The cache as one loaded version uses it: answers hits, records what misses produce."""

    store: ResponseCache
    stats: ModelStatistics
    builder: ResponseBuilder
    token: int = field(default_factory=lambda: next(_generations))  # this load's own key space

    def answer(self, job: Job, release: Callable[[], None]) -> bool:
        """Answer `job` from the cache (True: its sink has the response and its in-flight slot
        is released), or arrange for its successful response to be stored (False: queue it)."""
        start = time.monotonic_ns()
        request = job.request
        key = request_key(request, self.builder.model_name, self.builder.version, self.token)
        entry = self.store.lookup(key)
        response = None if entry is None else self._response(request, entry)
        if response is None:
            job.sink = self._storing(job.sink, key, time.monotonic_ns() - start)
            return False
        end = time.monotonic_ns()
        self.stats.record_cache_hit(end - job.enqueued_ns, start - job.enqueued_ns, end - start)
        self.stats.record_first_response(end - job.enqueued_ns)
        release()
        job.sink(response)
        return True

    def _response(self, request: InferRequest, entry: CachedResponse) -> InferResponse | None:
        """A fresh response with the request's id and the outputs it asked for; None when the
        entry lacks one of them (it was stored for a request that asked for fewer)."""
        tensors = []
        for requested in request.outputs or self.builder.all_outputs:
            cached = entry.outputs.get(requested.name)
            if cached is None:
                return None
            # A new Tensor: frontends add wire parameters to it; the read-only data is shared.
            tensors.append(Tensor(cached.name, cached.datatype, cached.shape, cached.data))
        return InferResponse(self.builder.model_name, self.builder.version, request.id, tensors,
                             dict(entry.parameters))

    def _storing(self, sink: ResponseSink, key: bytes, lookup_ns: int) -> ResponseSink:
        return _StoringSink(self, sink, key, lookup_ns)


class _StoringSink:
    """A job's sink that stores its final response in the cache first when it succeeded
    (failures are not cached)."""

    __slots__ = ("cache", "key", "lookup_ns", "sink")

    def __init__(self, cache: ModelCache, sink: ResponseSink, key: bytes, lookup_ns: int) -> None:
        self.cache = cache
        self.sink = sink
        self.key = key
        self.lookup_ns = lookup_ns

    def __call__(self, response: InferResponse) -> None:
        if response.final and response.error is None:
            cache = self.cache
            start = time.monotonic_ns()
            cache.store.insert(self.key, CachedResponse.of(response))
            cache.stats.record_cache_miss(self.lookup_ns, time.monotonic_ns() - start)
        self.sink(response)
