"""Keepalive for one HTTP/2 connection: the server's own pings (--grpc-keepalive-time/-timeout,
--grpc-http2-max-pings-without-data) and the limit on the client's pings
(--grpc-http2-min-recv-ping-interval-without-data, --grpc-http2-max-ping-strikes,
--grpc-keepalive-permit-without-calls), with the meaning gRPC's C core gives them."""

from __future__ import annotations

import math

from naiad.config.options import GrpcOptions

_IDLE_INTERVAL_S = 2 * 3600.0  # gRPC's interval for pings on a connection without calls


class PingPolicy:
    """Decides whether a client is pinging too often (gRPC's ping abuse policy)."""

    def __init__(self, options: GrpcOptions) -> None:
        self.min_interval_s = options.http2_min_recv_ping_interval_without_data_ms / 1000
        self.permit_without_calls = options.keepalive_permit_without_calls
        self.max_strikes = options.http2_max_ping_strikes
        self.strikes = 0
        self.last_ping = -math.inf

    def received_ping(self, now: float, idle: bool) -> bool:
        """Count one ping; True when the client has now pinged too often and must go away."""
        interval = _IDLE_INTERVAL_S if idle and not self.permit_without_calls else self.min_interval_s
        allowed_at = self.last_ping + interval
        self.last_ping = now
        if allowed_at <= now:
            return False
        self.strikes += 1
        return self.max_strikes != 0 and self.strikes > self.max_strikes

    def sent_data(self) -> None:
        """The server sent headers or data: pings are fine again."""
        self.strikes = 0
        self.last_ping = -math.inf


class PingSchedule:
    """When the server pings the client, and how long it waits for the answer."""

    def __init__(self, options: GrpcOptions) -> None:
        self.interval_s = options.keepalive_time_ms / 1000
        self.timeout_s = options.keepalive_timeout_ms / 1000
        self.permit_without_calls = options.keepalive_permit_without_calls
        self.max_without_data = options.http2_max_pings_without_data
        self.without_data = 0

    def should_ping(self, idle: bool) -> bool:
        """At a keepalive tick: ping unless the connection is idle (and that is not permitted)
        or the server already sent as many pings without data as it may."""
        if idle and not self.permit_without_calls:
            return False
        if self.max_without_data and self.without_data >= self.max_without_data:
            return False
        self.without_data += 1
        return True

    def sent_data(self) -> None:
        self.without_data = 0
