"""Flood limits for one connection: frames that cost the server work but ask it for nothing.

nginx, Envoy, nghttp2 and gRPC core all count these per connection and end the connection past a
limit, because each is cheap for a client to send and answering it costs more: CVE-2023-44487's
rapid reset (streams opened and reset at once), SETTINGS (each one wants an ACK), and a family of
"control" frames (PRIORITY, WINDOW_UPDATEs that free nothing, empty DATA and CONTINUATION frames,
PING ACKs nobody asked for, unknown frame types). Each kind has a token bucket refilled at its
--grpc-max-*-per-sec rate, with bursts of ten seconds' worth; a client past one gets GOAWAY
ENHANCE_YOUR_CALM. Pings have their own policy (keepalive.py).
"""

from __future__ import annotations

from naiad.config.options import GrpcOptions
from naiad.frontends.grpc.wire.frames import ENHANCE_YOUR_CALM, ProtocolError

BURST_SECONDS = 10  # a budget holds this many seconds' worth of its rate
# WINDOW_UPDATEs a client may send for free per DATA frame the server sent (it reads what we
# send and gives the window back: Envoy allows 10 per DATA frame); past that they count.
WINDOW_UPDATES_PER_DATA_FRAME = 4
MAX_WINDOW_CREDIT = 100_000


class Budget:
    """A token bucket: `rate` events per second, in bursts of up to `burst`.

    Refilled lazily, only once it runs dry, so spending costs a subtraction. A `rate` of 0
    turns the budget off (every spend succeeds).
    """

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def spend(self, now: float) -> bool:
        """Take one token; False when there is none left (the client has been flooding)."""
        if self.tokens < 1:
            if self.rate <= 0:
                return True
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens < 1:
                return False
        self.tokens -= 1
        return True


class FloodGuard:
    """The budgets of one connection; each `count_*` raises ProtocolError(ENHANCE_YOUR_CALM)
    once its budget is spent."""

    __slots__ = ("control", "resets", "settings", "window_credit")

    def __init__(self, options: GrpcOptions, now: float) -> None:
        self.resets = _budget(options.max_resets_per_sec, now)
        self.settings = _budget(options.max_settings_per_sec, now)
        self.control = _budget(options.max_control_frames_per_sec, now)
        self.window_credit = 0

    def data_sent(self) -> None:
        """A DATA frame went out: the WINDOW_UPDATEs answering it are free."""
        if self.window_credit < MAX_WINDOW_CREDIT:
            self.window_credit += WINDOW_UPDATES_PER_DATA_FRAME

    def count_window_update(self, now: float, what: str) -> None:
        """A WINDOW_UPDATE that frees nothing waiting: free while DATA sent earns credit."""
        if self.window_credit > 0:
            self.window_credit -= 1
        else:
            self.count_control(now, what)

    def count_reset(self, now: float) -> None:
        if not self.resets.spend(now):
            raise ProtocolError("too many streams reset or refused (rapid reset)", ENHANCE_YOUR_CALM)

    def count_settings(self, now: float) -> None:
        if not self.settings.spend(now):
            raise ProtocolError("too many SETTINGS frames", ENHANCE_YOUR_CALM)

    def count_control(self, now: float, what: str) -> None:
        if not self.control.spend(now):
            raise ProtocolError(f"too many control frames ({what})", ENHANCE_YOUR_CALM)


def _budget(rate: int, now: float) -> Budget:
    return Budget(rate, rate * BURST_SECONDS, now)
