"""Models loaded on demand and evicted least recently used (LRU-2) under a host-memory budget.

With `--model-load-on-demand`, a request for a model that is in the repository but not loaded
starts its load and waits for it instead of failing; with `--model-memory-budget`, loads first
unload the least recently used idle models until the new one fits. Triton never loads or
unloads by itself (triton#2659, #7279); this is the LRU its users ask for, in its LRU-2 form
(the order of each model's second-to-last request) so that one-off requests for rarely used
models evict each other rather than the models most traffic goes to.

One thread does every load and eviction, so a footprint measured around a load (the resident
set of the server and its model processes, before and after) belongs to that model alone, and
a model that was just loaded for waiting requests takes them (their in-flight slots are taken
in the load's callbacks, on that thread) before any later load could evict it as idle.

A model is never evicted while it has requests in flight or queued, in the second after a load
that a lookup waited for (FRESH_SECS), while it is pinned
(`parameters { key: "pinned" value { string_value: "true" } }`), or while a resident ensemble
uses it. An ensemble's steps that load with it are accounted to it and unload with it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from naiad.core.ensemble import ENSEMBLE_PLATFORM
from naiad.core.model import LoadedVersion
from naiad.errors import NotFound, Unavailable
from naiad.observability.metrics import MetricRow
from naiad.scheduling.base import Job, ResponseSink
from naiad.types import InferRequest

log = logging.getLogger(__name__)

PINNED_PARAMETER = "pinned"
#: how long a load waits for busy models to go idle when nothing can be evicted yet
ROOM_WAIT_SECS = 60.0
#: a model loaded for a lookup (`ensure(name, lookup=True)`: generate and the OpenAI routes read
#: the model's config before they submit) is not evicted this soon after: the request it was
#: loaded for is still on its way to it. Requests through `infer` take their slot at load time.
FRESH_SECS = 1.0
_ROOM_POLL_SECS = 0.01
_NEVER = (-1, -1)


class Lifecycle(Protocol):
    """What residency needs of the model lifecycle (core.lifecycle.ModelManager)."""

    def load(self, name: str) -> None: ...
    def evict(self, name: str) -> None: ...
    def serving(self, name: str) -> list[LoadedVersion]: ...
    def serving_names(self) -> list[str]: ...
    def source_path(self, name: str) -> Path | None: ...
    def in_repository(self, name: str) -> bool: ...


class WaitingJob(Job):
    """A request waiting for its model to load; once loaded it becomes `started`, the job its
    scheduler holds, and cancelling this cancels that."""

    __slots__ = ("started",)

    def __init__(self, request: InferRequest, sink: ResponseSink) -> None:
        super().__init__(request, sink)
        self.started: Job | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.started is not None:
            self.started.cancel()


@dataclass(slots=True)
class Resident:
    """A model residency tracks: its measured footprint, the steps that loaded with it, and when
    its load finished."""

    footprint: int
    carried: tuple[str, ...] = ()  # an ensemble's steps loaded with it (their memory is in footprint)
    protected_until: float = 0.0  # time.monotonic(): not evicted before (see FRESH_SECS)


@dataclass(slots=True)
class Counts:
    """Per-model counters behind the nv_model_* residency metrics."""

    loads: int = 0
    load_ns: int = 0
    evictions: int = 0
    cold_starts: int = 0
    cold_wait_ns: int = 0


class Residency:
    """Which models are resident, when each was last used, and the loads and evictions."""

    def __init__(self, lifecycle: Lifecycle, budget_bytes: int = 0,
                 measure: Callable[[], int] | None = None, fresh_secs: float = FRESH_SECS) -> None:
        self._lifecycle = lifecycle
        self.budget = budget_bytes  # 0: no budget (load on demand, never evict)
        self._fresh_secs = fresh_secs
        self._measure = measure or process_tree_rss
        self._residents: dict[str, Resident] = {}
        self._measured: dict[str, int] = {}  # name -> footprint when last loaded (the next estimate)
        # name -> ticks of its last two requests (LRU-2 order), kept across evictions
        self._used: dict[str, tuple[int, int]] = {}
        self._tick = itertools.count()
        self._counts: dict[str, Counts] = {}
        self._loading: dict[str, Future[None]] = {}
        self._lookups: set[str] = set()  # models whose load a lookup waits for (FRESH_SECS)
        self._active = 0  # loads under way (see load_now)
        self._lock = threading.Lock()  # guards _residents, _loading and _counts (read by other threads)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="naiad-residency")

    # -- the hot path ------------------------------------------------------------------------

    def touch(self, name: str) -> None:
        """A request for a resident model: its last two uses move on (one lookup, one store)."""
        self._used[name] = (self._used.get(name, _NEVER)[1], next(self._tick))

    # -- loads -------------------------------------------------------------------------------

    def ensure(self, name: str, lookup: bool = False) -> Future[None]:
        """The load of `name`, started unless one is under way: done once it serves (or failed).
        `lookup`: the caller looks the model up once it serves, then submits (FRESH_SECS)."""
        with self._lock:
            if lookup:
                self._lookups.add(name)
            future = self._loading.get(name)
            if future is not None:
                return future
            future = self._thread.submit(self._load, name)
            self._loading[name] = future
        # Outside the lock: a load that is done already runs the callback here, at once.
        future.add_done_callback(lambda _: self._forget(name, future))
        return future

    def load_now(self, name: str, load: Callable[[], None]) -> None:
        """An explicit load (the repository API): on the residency thread, after making room.
        While that thread is inside a load, this may be the loading model's initialize()
        loading another (pb_utils model control): waiting for the thread would wait for itself,
        so the load runs here (its measurement may then include the other load's memory)."""
        if self._active:
            self._load(name, load)
            return
        self._thread.submit(self._load, name, load).result()

    def cold_start(self, name: str, waited_ns: int) -> None:
        with self._lock:
            counts = self._counts.setdefault(name, Counts())
            counts.cold_starts += 1
            counts.cold_wait_ns += waited_ns

    def _forget(self, name: str, future: Future[None]) -> None:
        with self._lock:
            if self._loading.get(name) is future:
                del self._loading[name]

    def _load(self, name: str, load: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._active += 1
        try:
            self._load_measured(name, load)
        finally:
            with self._lock:
                self._active -= 1
                self._lookups.discard(name)

    def _load_measured(self, name: str, load: Callable[[], None] | None) -> None:
        """Load `name` (with `load`: the repository API's load, which may also be a reload)
        after making room for it, and measure what it took."""
        before_names = set(self._lifecycle.serving_names())
        if load is None:
            if name in before_names:
                return  # it serves already: a request raced a load that had just finished
            if not self._lifecycle.in_repository(name):
                raise NotFound(f"Request for unknown model: '{name}' is not found")
        self._make_room(name, self._estimate(name))
        started = time.monotonic_ns()
        before = self._measure()
        (load or functools.partial(self._lifecycle.load, name))()
        carried = tuple(sorted(set(self._lifecycle.serving_names()) - before_names - {name}))
        # An LLM's KV cache is zeroed, untouched pages until tokens fill it: count it whole.
        reserved = sum(v.host_bytes_reserved() for step in (name, *carried) for v in self._lifecycle.serving(step))
        footprint = max(self._measure() - before, reserved)
        # Its requests count its use (each goes through `touch` once it serves); a load by the
        # repository API is no use: a model no request asked for yet ranks first for eviction.
        self._used.setdefault(name, _NEVER)
        with self._lock:
            previous = self._residents.get(name)  # a reload adds to what the model held
            if previous is not None:
                footprint += previous.footprint
                carried = tuple(sorted({*carried, *previous.carried}))
            protected = time.monotonic() + self._fresh_secs if name in self._lookups else 0.0
            self._residents[name] = Resident(footprint, carried, protected)
            self._measured[name] = footprint
            counts = self._counts.setdefault(name, Counts())
            counts.loads += 1
            counts.load_ns += time.monotonic_ns() - started
        log.info("loaded '%s': %d bytes resident (%d of a budget of %d in all)",
                 name, footprint, self.resident_bytes(), self.budget)
        self._fit(keep=name)

    def _estimate(self, name: str) -> int:
        """Bytes a model will take: what it took when last measured; before that its files, or
        the mean footprint of the models measured so far when that is more (a model process
        costs more than its files). Nothing for a model that serves already (a reload)."""
        with self._lock:
            if name in self._residents:
                return 0
            if name in self._measured:
                return self._measured[name]
            measured = list(self._measured.values())
        path = self._lifecycle.source_path(name)
        files = _tree_size(path) if path is not None else 0
        return max(files, sum(measured) // len(measured) if measured else 0)

    # -- evictions ---------------------------------------------------------------------------

    def _make_room(self, name: str, need: int) -> None:
        """Evict least recently used idle models until `need` more bytes fit the budget; while
        every resident model is busy or pinned, wait for one to go idle (ROOM_WAIT_SECS)."""
        if not self.budget:
            return
        if need > self.budget:
            raise Unavailable(f"model '{name}' needs about {need} bytes, more than the model memory "
                              f"budget of {self.budget} bytes")
        deadline = time.monotonic() + ROOM_WAIT_SECS
        while self.resident_bytes() + need > self.budget:
            victim = self._victim(exclude={name})
            if victim is not None:
                self._evict(victim)
                continue
            if time.monotonic() > deadline:
                raise Unavailable(f"model '{name}' cannot be loaded: the model memory budget of {self.budget} "
                                  f"bytes is held by models in use or pinned")
            time.sleep(_ROOM_POLL_SECS)  # every resident model is busy: wait for one to go idle

    def _fit(self, keep: str) -> None:
        """After a load measured more than estimated: evict idle models until within budget,
        never `keep`, the model just loaded (its waiting requests have not reached it yet)."""
        while self.budget and self.resident_bytes() > self.budget:
            victim = self._victim(exclude={keep})
            if victim is None:
                log.warning("resident models take %d bytes, over the model memory budget of %d: "
                            "none can be evicted now", self.resident_bytes(), self.budget)
                return
            self._evict(victim)

    def _victim(self, exclude: set[str]) -> str | None:
        """The resident model whose second-to-last request is oldest (LRU-2), among those that
        may be evicted now: a model asked for once goes before any asked for twice, so a burst
        of one-off requests cannot push out the models most requests use."""
        with self._lock:
            residents = dict(self._residents)
        held = {step for resident in residents.values() for step in resident.carried}
        held |= {step for name in residents for step in _steps(self._lifecycle.serving(name))}
        now = time.monotonic()
        candidates = [name for name, resident in residents.items() if name not in exclude and name not in held
                      and resident.protected_until <= now and self._evictable(name)]
        return min(candidates, key=lambda n: self._used.get(n, _NEVER), default=None)

    def _evictable(self, name: str) -> bool:
        versions = self._lifecycle.serving(name)
        return not any(_pinned(v) or v.busy() for v in versions)

    def _evict(self, name: str) -> None:
        with self._lock:
            resident = self._residents.pop(name, None)
        if resident is None:
            return  # a load running beside this one (see load_now) evicted it first
        for step in (name, *resident.carried):
            self._lifecycle.evict(step)
            with self._lock:
                self._counts.setdefault(step, Counts()).evictions += 1
        log.info("evicted '%s' (least recently used): %d bytes freed", name, resident.footprint)

    def forget(self, name: str) -> None:
        """`name` was unloaded by other means (the repository API, a poll): stop counting it."""
        with self._lock:
            self._residents.pop(name, None)

    # -- what is reported --------------------------------------------------------------------

    def resident_bytes(self) -> int:
        return sum(self.resident().values())

    def resident(self) -> dict[str, int]:
        """Resident models and their footprints (bytes)."""
        with self._lock:
            return {name: resident.footprint for name, resident in self._residents.items()}

    def metric_rows(self) -> list[MetricRow]:
        rows = [MetricRow("nv_model_memory_budget_bytes", "gauge",
                          "Host memory budget for resident models, in bytes (0: none)", self.budget)]
        for name, footprint in sorted(self.resident().items()):
            rows.append(MetricRow("nv_model_resident_bytes", "gauge",
                                  "Measured host memory of a resident model, in bytes", footprint,
                                  (("model", name),)))
        with self._lock:
            counts = sorted(self._counts.items())
        for name, count in counts:
            labels = (("model", name),)
            rows += [
                MetricRow("nv_model_load_count", "counter", "Number of on-demand model loads", count.loads, labels),
                MetricRow("nv_model_load_duration_us", "counter",
                          "Cumulative on-demand load duration in microseconds", count.load_ns // 1000, labels),
                MetricRow("nv_model_eviction_count", "counter",
                          "Number of evictions to keep within the memory budget", count.evictions, labels),
                MetricRow("nv_model_cold_start_count", "counter",
                          "Number of requests that waited for their model to load", count.cold_starts, labels),
                MetricRow("nv_model_cold_start_wait_us", "counter",
                          "Cumulative time requests waited for their model to load, in microseconds",
                          count.cold_wait_ns // 1000, labels),
            ]
        return rows

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


def _pinned(loaded: LoadedVersion) -> bool:
    parameter = loaded.config.parameters.get(PINNED_PARAMETER)
    return parameter is not None and parameter.string_value.strip().lower() in ("true", "1", "yes")


def _steps(versions: list[LoadedVersion]) -> set[str]:
    return {step.model_name for v in versions if v.config.platform == ENSEMBLE_PLATFORM
            for step in v.config.ensemble_scheduling.step}


def _tree_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for file in files:
            try:
                total += os.stat(os.path.join(root, file)).st_size
            except OSError:
                continue
    return total


def process_tree_rss(pid: int | None = None, proc: Path = Path("/proc")) -> int:
    """Resident bytes of this process and every process below it (model processes): 0 where
    /proc is not there."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, pending, seen = 0, [pid or os.getpid()], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            total += int((proc / str(current) / "statm").read_text().split()[1]) * page
            tasks = (proc / str(current) / "task").iterdir()
            for task in tasks:
                children = (task / "children").read_text().split()
                pending.extend(int(child) for child in children)
        except (OSError, ValueError, IndexError):
            continue
    return total

