"""FlowControl (both directions' windows) and the flood budgets, on their own."""

from __future__ import annotations

import pytest

from naiad.config.options import GrpcOptions
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.floods import Budget, FloodGuard
from naiad.frontends.grpc.wire.flow import FlowControl


def test_receiving_checks_the_windows_before_giving_them_back() -> None:
    flow = FlowControl(stream_window=100, connection_window=1000)
    flow.open(1)
    update, within = flow.received(1, 60)
    assert update is None and within
    assert flow.refill(1) == f.window_update(1, 60)  # past half used: given back
    _, within = flow.received(1, 101)
    assert not within  # the stream's window overrun: a stream error
    with pytest.raises(f.ProtocolError) as caught:
        flow.received(3, 1000)  # a closed stream's data still counts on the connection
    assert caught.value.code == f.FLOW_CONTROL_ERROR


def test_the_connection_window_is_given_back_at_half() -> None:
    flow = FlowControl(stream_window=100, connection_window=1000)
    assert flow.received(1, 400) == (None, True)
    assert flow.received(1, 200)[0] == f.window_update(0, 600)


def test_sending_within_both_windows_and_the_frame_size() -> None:
    flow = FlowControl(stream_window=100, connection_window=1000)
    flow.open(1)
    assert flow.budget(1, 1 << 20) == f.DEFAULT_WINDOW
    flow.peer_settings(10)
    assert flow.budget(1, 16384) == 10 and flow.budget(1, 4) == 4
    flow.spend(1, 10)
    assert flow.blocked(1)
    assert flow.granted(1, 5) and flow.budget(1, 16384) == 5


def test_window_errors() -> None:
    flow = FlowControl(stream_window=100, connection_window=1000)
    flow.open(1)
    assert not flow.granted(1, 0)  # WINDOW_UPDATE of 0: reset the stream
    assert not flow.granted(1, f.MAX_WINDOW)  # past 2^31-1
    with pytest.raises(f.ProtocolError):
        flow.granted(0, 0)
    with pytest.raises(f.ProtocolError) as caught:
        flow.granted(0, f.MAX_WINDOW)
    assert caught.value.code == f.FLOW_CONTROL_ERROR
    flow = FlowControl(stream_window=100, connection_window=1000)
    flow.open(1)
    flow.granted(1, f.MAX_WINDOW - f.DEFAULT_WINDOW)
    with pytest.raises(f.ProtocolError):
        flow.peer_settings(f.DEFAULT_WINDOW + 1)  # moves the stream past 2^31-1


def test_a_budget_allows_bursts_then_its_rate() -> None:
    budget = Budget(rate=10, burst=100, now=0.0)
    assert all(budget.spend(0.0) for _ in range(100))
    assert not budget.spend(0.0)
    assert budget.spend(0.2)  # 0.2 s at 10/s: two more
    assert budget.spend(0.2) and not budget.spend(0.2)
    assert all(budget.spend(100.0) for _ in range(100))  # refilled, but never past the burst
    assert not budget.spend(100.0)
    off = Budget(rate=0, burst=0, now=0.0)
    assert all(off.spend(0.0) for _ in range(10_000))


def test_window_updates_are_free_while_data_goes_out() -> None:
    guard = FloodGuard(GrpcOptions(max_control_frames_per_sec=1), now=0.0)
    for _ in range(1000):  # a client reading a long answer gives the window back as it reads
        guard.data_sent()
        guard.count_window_update(0.0, "WINDOW_UPDATE")
        guard.count_window_update(0.0, "WINDOW_UPDATE")
    for _ in range(2000 + 10):  # what is left of the credit, then the burst
        guard.count_window_update(0.0, "WINDOW_UPDATE")
    with pytest.raises(f.ProtocolError):
        guard.count_window_update(0.0, "WINDOW_UPDATE")
