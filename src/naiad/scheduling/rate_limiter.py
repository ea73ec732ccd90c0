"""Triton's rate limiter (--rate-limit=execution_count): an instance may execute a batch only
while it holds the resources its instance group's `rate_limiter` names.

Resources are counted per device (`global` ones once for the whole server). A resource given
with --rate-limit-resource=name:count[:device] has that many units; one never given gets as many
as the largest single need registered, so every instance can run alone. When several instances
wait, the one with the lowest `priority` value goes first (ties: the one waiting longest).
Nobody blocks: an instance that cannot have its resources is told when to try again.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from naiad.errors import InvalidArgument

ResourceKey = tuple[str, int | None]  # (name, device); GLOBAL_DEVICE for `global` resources
GLOBAL_DEVICE = -1


@dataclass(order=True, slots=True)
class _Waiter:
    priority: int
    ticket: int
    on_ready: Callable[[], None] = field(compare=False)


@dataclass(frozen=True, slots=True)
class Needs:
    """What one instance must hold to execute, and its priority (lower runs first)."""

    resources: tuple[tuple[ResourceKey, int], ...]
    priority: int = 0


class RateLimiter:
    def __init__(self, available: dict[ResourceKey, int] | None = None) -> None:
        self._given = dict(available or {})  # device None: the count on every device
        self._capacity: dict[ResourceKey, int] = {}
        self._free: dict[ResourceKey, int] = {}
        self._lock = threading.Lock()
        self._waiting: dict[object, _Waiter] = {}  # instances waiting for resources
        self._tickets = itertools.count()

    def register(self, needs: Needs) -> None:
        """Set up the pools this instance draws from; a resource nobody configured gets enough
        units for the largest single need. InvalidArgument when a configured pool is too small."""
        with self._lock:
            self._ensure(needs)

    def _ensure(self, needs: Needs) -> None:
        for key, count in needs.resources:
            if key in self._capacity and count <= self._capacity[key]:
                continue
            given = self._given.get(key, self._given.get((key[0], None)))
            if given is not None and count > given:
                raise InvalidArgument(f"rate limiter resource '{key[0]}' needs {count} but only {given} are available")
            capacity = given if given is not None else max(count, self._capacity.get(key, 0))
            self._free[key] = self._free.get(key, 0) + capacity - self._capacity.get(key, 0)
            self._capacity[key] = capacity

    def try_acquire(self, needs: Needs, waiter: object, on_ready: Callable[[], None]) -> bool:
        """Take `needs` if they fit and no instance ahead in line (lower priority value, then
        longer waiting) waits for resources; else queue `waiter` (one entry per waiter, kept
        until it acquires) and return False: `on_ready` is called, outside the lock, whenever it
        is first in line and may fit, so it tries again."""
        with self._lock:
            self._ensure(needs)
            entry = self._waiting.get(waiter)
            if entry is None:
                entry = self._waiting[waiter] = _Waiter(needs.priority, next(self._tickets), on_ready)
            if min(self._waiting.values()) is not entry or not self._fits(needs):
                return False
            del self._waiting[waiter]
            for key, count in needs.resources:
                self._free[key] -= count
            ready = self._first_in_line()  # the next in line may fit too
        if ready is not None:
            ready()
        return True

    def release(self, needs: Needs) -> None:
        with self._lock:
            for key, count in needs.resources:
                self._free[key] += count
            ready = self._first_in_line()
        if ready is not None:
            ready()

    def _first_in_line(self) -> Callable[[], None] | None:
        return min(self._waiting.values()).on_ready if self._waiting else None

    def _fits(self, needs: Needs) -> bool:
        return all(self._free.get(key, 0) >= count for key, count in needs.resources)
