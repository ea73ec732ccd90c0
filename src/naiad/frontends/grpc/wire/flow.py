"""HTTP/2 flow control (RFC 9113 §5.2, §6.9) for one connection, both directions.

Receiving: the client may send a stream at most `stream_window` bytes ahead of what the server has
granted, and the connection `connection_window` bytes ahead; sending more is FLOW_CONTROL_ERROR
(a stream error for a stream's window, a connection error for the connection's). The connection
window is given back as data arrives; a stream's only when the connection asks (`refill`), which
is how a call whose reader has fallen behind holds its client back.

Sending: what the client's windows allow, per stream and for the connection; its WINDOW_UPDATEs
and SETTINGS_INITIAL_WINDOW_SIZE move them, and may not push one past 2^31-1.

Calls keep no window state: everything is here, by stream id.
"""

from __future__ import annotations

from naiad.frontends.grpc.wire import frames as f


class FlowControl:
    """The windows of one connection and of each of its open streams."""

    def __init__(self, stream_window: int, connection_window: int) -> None:
        self.stream_window = stream_window  # what we announced as SETTINGS_INITIAL_WINDOW_SIZE
        self.connection_window = connection_window
        self.receive_left = connection_window  # what the client may still send on the connection
        self.receiving: dict[int, int] = {}  # ... and on each stream
        self.peer_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.send_left = f.DEFAULT_WINDOW  # what we may still send on the connection
        self.sending: dict[int, int] = {}  # ... and on each stream

    def open(self, stream_id: int) -> None:
        self.receiving[stream_id] = self.stream_window
        self.sending[stream_id] = self.peer_window

    def close(self, stream_id: int) -> None:
        self.receiving.pop(stream_id, None)
        self.sending.pop(stream_id, None)

    # -- receiving --------------------------------------------------------------------------

    def received(self, stream_id: int, size: int) -> tuple[bytes | None, bool]:
        """Account `size` bytes of DATA (padding included): the connection's WINDOW_UPDATE to
        send, if any, and whether the stream kept within its window (always True for a stream
        no longer open). ProtocolError when the connection's window was overrun."""
        left = self.receive_left - size
        if left < 0:
            raise f.ProtocolError(f"the client overran the connection window by {-left} bytes", f.FLOW_CONTROL_ERROR)
        update = None
        if left < self.connection_window // 2:
            update = f.window_update(0, self.connection_window - left)
            left = self.connection_window
        self.receive_left = left
        window = self.receiving.get(stream_id)
        if window is None:
            return update, True
        window -= size
        self.receiving[stream_id] = window
        return update, window >= 0

    def refill(self, stream_id: int) -> bytes | None:
        """The stream's WINDOW_UPDATE once the client has used half its window, else None."""
        window = self.receiving.get(stream_id)
        if window is None or window >= self.stream_window // 2:
            return None
        self.receiving[stream_id] = self.stream_window
        return f.window_update(stream_id, self.stream_window - window)

    # -- sending ----------------------------------------------------------------------------

    def budget(self, stream_id: int, max_frame: int) -> int:
        """Bytes of DATA the stream may send now, at most one frame's worth."""
        return min(self.send_left, self.sending.get(stream_id, 0), max_frame)

    def spend(self, stream_id: int, size: int) -> None:
        self.send_left -= size
        self.sending[stream_id] -= size

    def blocked(self, stream_id: int) -> bool:
        """The connection's or the stream's window is spent."""
        return self.send_left <= 0 or self.sending.get(stream_id, 0) <= 0

    def granted(self, stream_id: int, increment: int) -> bool:
        """A WINDOW_UPDATE from the client. False when it broke a stream's window (an increment
        of 0, or past 2^31-1: the stream must be reset); ProtocolError for the connection's."""
        if stream_id == 0:
            if increment == 0:
                raise f.ProtocolError("WINDOW_UPDATE of 0 on the connection")
            self.send_left += increment
            if self.send_left > f.MAX_WINDOW:
                raise f.ProtocolError("connection window past 2^31-1", f.FLOW_CONTROL_ERROR)
            return True
        window = self.sending.get(stream_id)
        if window is None:
            return True  # a stream already closed: nothing to do
        window += increment
        self.sending[stream_id] = window
        return increment > 0 and window <= f.MAX_WINDOW

    def peer_settings(self, window: int) -> None:
        """The client's SETTINGS_INITIAL_WINDOW_SIZE: every open stream's window moves by the
        change (RFC 9113 §6.9.2); past 2^31-1 is a connection error."""
        if window > f.MAX_WINDOW:
            raise f.ProtocolError("initial window too large", f.FLOW_CONTROL_ERROR)
        change = window - self.peer_window
        self.peer_window = window
        if change:
            sending = self.sending
            for stream_id in sending:
                sending[stream_id] += change
                if sending[stream_id] > f.MAX_WINDOW:
                    raise f.ProtocolError("a stream window past 2^31-1", f.FLOW_CONTROL_ERROR)
