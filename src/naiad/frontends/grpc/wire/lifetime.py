"""How long one connection lives: keepalive pings, maximum age, maximum idle time, and the
linger after a close. Each is a `Timer`; the connection tells this object when its first call
opens and its last one ends (`busy` / `idle`), and hands it the PINGs it receives.

- keepalive (--grpc-keepalive-time / -timeout): the server pings the client and gives up on a
  connection whose answer does not come (keepalive.py holds the policies);
- maximum age (--grpc-max-connection-age-ms / -grace-ms, age.py): GOAWAY in gRPC core's two
  steps, then a grace for the calls still open;
- maximum idle time (--grpc-max-connection-idle-ms, gRPC core's GRPC_ARG_MAX_CONNECTION_IDLE_MS):
  a connection without calls this long gets GOAWAY and closes (a lazy `IdleTimer`: a call that
  opens and ends costs two stores);
- linger: a connection closed while its client reads nothing is aborted after LINGER_S rather
  than held for ever with its unsent bytes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

from naiad.config.options import GrpcOptions
from naiad.frontends.connections import IdleTimer
from naiad.frontends.grpc.wire import age
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.keepalive import PingPolicy, PingSchedule
from naiad.frontends.grpc.wire.timers import Timer

log = logging.getLogger(__name__)

LINGER_S = 2.0


class Owner(Protocol):
    """What the lifetime needs of its connection."""

    calls: dict[int, Any]
    going_away: bool

    def emit(self, data: bytes) -> None: ...
    def go_away(self, debug: bytes = b"") -> None: ...
    def close(self, code: int = f.NO_ERROR, debug: bytes = b"") -> None: ...
    def abort(self) -> None: ...


class Lifetime:
    def __init__(self, owner: Owner, options: GrpcOptions) -> None:
        self.owner = owner
        self.options = options
        self.ping_policy = PingPolicy(options)
        self.pings = PingSchedule(options)
        self.idle_timer = IdleTimer(max(options.max_connection_idle_ms, 0) / 1000, self._idle_expired)
        self._age_ping: bytes | None = None  # the PING between max-age's two GOAWAYs
        self.keepalive = Timer(self._keepalive)
        self.ping_timeout = Timer(self._ping_timed_out)
        self.age = Timer(self._age_reached)
        self.age_ping = Timer(self._age_go_away)
        self.age_grace = Timer(self._age_grace_over)
        self.linger = Timer(self._linger_over)
        self._all = (self.keepalive, self.ping_timeout, self.age, self.age_ping, self.age_grace, self.idle_timer,
                     self.linger)

    def start(self) -> None:
        if self.pings.interval_s > 0:
            self.keepalive.start(self.pings.interval_s)
        limit = age.age_seconds(self.options)
        if limit > 0:
            self.age.start(limit)
        self.idle(time.monotonic())

    def stop(self) -> None:
        for timer in self._all:
            timer.cancel()

    # -- told by the connection -------------------------------------------------------------

    def busy(self) -> None:
        """The connection's first call opened."""
        self.idle_timer.busy()

    def idle(self, now: float) -> None:
        """The connection's last call ended (or it just opened)."""
        self.idle_timer.idle(now)

    def sent_data(self) -> None:
        self.ping_policy.sent_data()
        self.pings.sent_data()

    def ping(self, payload: bytes, now: float) -> bool:
        """A PING from the client: False when it has pinged too often and must go away."""
        return not self.ping_policy.received_ping(now, idle=not self.owner.calls)

    def ping_acked(self, payload: bytes) -> bool:
        """A PING ACK: True when it answers one of ours."""
        if self._age_ping is not None and payload == self._age_ping:
            self._age_go_away()
            return True
        if self.ping_timeout.armed:
            self.ping_timeout.cancel()
            return True
        return False

    def closing(self) -> None:
        """The connection was closed: abort it if its last bytes cannot be written soon."""
        self.linger.start(LINGER_S)

    # -- timers -----------------------------------------------------------------------------

    def _keepalive(self) -> None:
        # An unanswered ping first: should_ping counts the ping it allows, so a tick that sends
        # nothing must not ask it (or slow answers would use up the pings without data).
        if not self.ping_timeout.armed and self.pings.should_ping(idle=not self.owner.calls):
            self.owner.emit(f.frame(f.PING, 0, 0, os.urandom(8)))
            self.ping_timeout.start(self.pings.timeout_s)
        self.keepalive.start(self.pings.interval_s)

    def _ping_timed_out(self) -> None:
        log.debug("gRPC client did not answer a keepalive ping: closing its connection")
        self.owner.abort()

    def _idle_expired(self) -> None:
        if self.owner.going_away:
            return
        log.debug("gRPC connection idle for --grpc-max-connection-idle-ms: sending GOAWAY")
        self.owner.go_away(b"max_idle")

    def _age_reached(self) -> None:
        """The connection is --grpc-max-connection-age-ms old: end it gracefully, as gRPC core
        does: GOAWAY naming every stream, a PING, and once its answer shows the client has seen
        the GOAWAY, the final GOAWAY; calls then open finish (within the grace) and it closes."""
        if self.owner.going_away:
            return
        log.debug("gRPC connection reached its maximum age: sending GOAWAY")
        self._age_ping = os.urandom(8)
        self.owner.emit(f.goaway(age.MAX_STREAM_ID, f.NO_ERROR, b"max_age"))
        self.owner.emit(f.frame(f.PING, 0, 0, self._age_ping))
        self.age_ping.start(age.PING_WAIT_S)
        grace = age.grace_seconds(self.options)
        if grace > 0:
            self.age_grace.start(grace)

    def _age_go_away(self) -> None:
        self.age_ping.cancel()
        self._age_ping = None
        if not self.owner.going_away:
            self.owner.go_away()

    def _age_grace_over(self) -> None:
        if self.owner.calls:
            log.debug("gRPC calls still open after the maximum connection age's grace: closing")
        self.owner.close()

    def _linger_over(self) -> None:
        log.debug("gRPC client read nothing after its connection was closed: aborting it")
        self.owner.abort()
