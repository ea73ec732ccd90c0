"""What HTTP and gRPC connections share: --max-connections, the lazy idle timer, and the
reasons a connection's reading is paused.

--max-connections: how many HTTP and gRPC connections the server holds at once.

Modelled on nginx's worker_connections: every socket costs a file descriptor, and a client that
opens thousands of idle ones used to exhaust the process's open-file limit, after which accept()
failed for everyone. Both listeners share one `ConnectionLimit`. At the limit, the connection idle
the longest (a keep-alive HTTP connection between requests, a gRPC connection without calls) is
closed to make room, as nginx reuses idle keep-alive connections; when none is idle the newcomer
is refused cleanly (HTTP 503, gRPC GOAWAY) and closed, so the server never runs out of
descriptors. `fit_open_files` keeps the limit within what the process may open.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

#: Descriptors kept for everything but client connections: model files, pipes and shared
#: memory of model processes, the metrics port, logs.
RESERVED_FILES = 256


class Member(Protocol):
    def evict(self) -> None:
        """Close: the connection is idle and a new one needs its place."""


class ConnectionLimit:
    """Admission of connections across listeners; members report when they turn busy or idle.

    At the limit, a newcomer takes the place of the connection idle the longest, preferring one
    that has never carried a request (what a flood of idle sockets looks like) over a client's
    pooled keep-alive connection between two requests.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self.members: set[Member] = set()
        self.fresh: dict[Member, None] = {}  # idle since they opened, never used: oldest first
        self.idle_members: dict[Member, None] = {}  # idle after a request: in the order they turned idle

    def admit(self, member: Member) -> bool:
        """Count `member` in; False when the server is full of busy connections."""
        if self.limit and len(self.members) >= self.limit:
            oldest = next(iter(self.fresh), None) or next(iter(self.idle_members), None)
            if oldest is None:
                return False
            self.release(oldest)
            oldest.evict()
        self.members.add(member)
        self.fresh[member] = None
        return True

    def release(self, member: Member) -> None:
        """The member's connection is gone (safe to call more than once)."""
        self.members.discard(member)
        self.fresh.pop(member, None)
        self.idle_members.pop(member, None)

    def busy(self, member: Member) -> None:
        self.fresh.pop(member, None)
        self.idle_members.pop(member, None)

    def idle(self, member: Member) -> None:
        if member in self.members:
            self.idle_members[member] = None


def fit_open_files(limit: int) -> int:
    """`limit` (0: none), lowered if the open-file limit cannot hold it plus RESERVED_FILES.

    The soft limit is raised towards the hard one first, as nginx's worker_rlimit_nofile does.
    With no connection limit, returns 0 unchanged."""
    if limit <= 0:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limit + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < wanted:
        fitted = max(soft - RESERVED_FILES, 16)
        log.warning("--max-connections %d needs %d open files, but the limit is %d: serving at most %d "
                    "connections (raise `ulimit -n`)", limit, wanted, soft, fitted)
        return fitted
    return limit


class IdleTimer:
    """Calls `on_expiry` once a connection has been idle for `timeout` seconds (0: never). The
    HTTP protocol also times its read deadline with one: there `idle()` starts a wait for a
    request's bytes and `busy()` ends it.

    Lazy, because connections turn busy and idle once per request: `busy()` and `idle()` are
    stores, and the one timer is armed only when none is, re-arming itself for the rest when
    it fires on a connection that was busy in between.
    """

    __slots__ = ("_handle", "on_expiry", "since", "timeout")

    def __init__(self, timeout: float, on_expiry: Callable[[], object]) -> None:
        self.timeout = timeout
        self.on_expiry = on_expiry
        self.since = 0.0  # when the connection fell idle; 0: busy
        self._handle: asyncio.TimerHandle | None = None

    def idle(self, now: float | None = None) -> None:
        self.since = now if now is not None else time.monotonic()
        if self.timeout > 0 and self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.timeout, self._check)

    def busy(self) -> None:
        self.since = 0.0

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if not self.since:
            return  # busy: the next idle() arms the timer again
        left = self.since + self.timeout - time.monotonic()
        if left > 0:
            self._handle = asyncio.get_running_loop().call_later(left, self._check)
        else:
            self.on_expiry()


class ReadPauses:
    """The reasons a connection's reading is paused; it resumes once the last is lifted."""

    __slots__ = ("reasons", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reasons: set[str] = set()

    def pause(self, reason: str) -> None:
        if not self.reasons and self.transport is not None:
            self.transport.pause_reading()
        self.reasons.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self.reasons:
            return
        self.reasons.discard(reason)
        if not self.reasons and self.transport is not None:
            self.transport.resume_reading()
