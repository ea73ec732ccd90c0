"""Triton's rate limiter (--rate-limit=execution_count): an instance may execute a batch only
while it holds the resources its instance group's `rate_limiter` names.

Resources are counted per device (`global` ones once for the whole server). A resource given
with --rate-limit-resource=name:count[:device] has that many units; one never given gets as many
as the largest single need registered, so every instance can run alone. When several instances
wait, the one with the lowest `priority` value goes first (ties: the one waiting longest).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from naiad.errors import InvalidArgument
from naiad.scheduling.base import Job, Runner

ResourceKey = tuple[str, int | None]  # (name, device); GLOBAL_DEVICE for `global` resources
GLOBAL_DEVICE = -1


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
        self._changed = threading.Condition(self._lock)
        self._waiting: list[tuple[int, int]] = []  # (priority, ticket) of instances waiting
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

    def wrap(self, runner: Runner, needs: Needs) -> Runner:
        """A runner that holds `needs` while the wrapped one executes."""
        self.register(needs)

        def limited(jobs: list[Job]) -> None:
            self.acquire(needs)
            try:
                runner(jobs)
            finally:
                self.release(needs)

        return limited

    def acquire(self, needs: Needs) -> None:
        with self._lock:
            self._ensure(needs)
            me = (needs.priority, next(self._tickets))
            self._waiting.append(me)
            self._changed.wait_for(lambda: min(self._waiting) == me and self._fits(needs))
            self._waiting.remove(me)
            for key, count in needs.resources:
                self._free[key] -= count
            self._changed.notify_all()  # the next in line may fit too

    def release(self, needs: Needs) -> None:
        with self._lock:
            for key, count in needs.resources:
                self._free[key] += count
            self._changed.notify_all()

    def _fits(self, needs: Needs) -> bool:
        return all(self._free.get(key, 0) >= count for key, count in needs.resources)
