"""StubProcess's sending to its model process: messages gathered for the end of the loop's turn,
and a message that must go at once behind them."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from naiad.backends.python import messages as p
from naiad.backends.python.process import StubProcess
from naiad.errors import InternalError


def _connected() -> tuple[StubProcess, p.Channel]:
    ours, theirs = socket.socketpair()
    process = StubProcess("m_0", "python3")
    process.channel = p.Channel(ours)
    return process, p.Channel(theirs)


def test_a_message_sent_now_goes_after_what_waits_for_the_end_of_the_turn() -> None:
    process, model = _connected()
    flushes: list[Callable[[], None]] = []

    def call_soon(callback: Callable[[], None]) -> bool:  # the loop's: run at the end of its turn
        flushes.append(callback)
        return True

    process.send_soon(p.Frees([1, 0]), call_soon)
    process.send_soon(p.Frees([2, 0]), call_soon)
    process.send_now(p.Execute(7, []))

    assert [model.recv() for _ in range(3)] == [p.Frees([1, 0]), p.Frees([2, 0]), p.Execute(7, [])]
    assert len(flushes) == 1
    flushes[0]()  # the turn's end: nothing left to send
    process.send_now(p.Execute(8, []))
    assert model.recv() == p.Execute(8, [])  # (nothing sent twice before it)
    assert not model.has_frame()


def test_sending_now_to_a_process_that_is_not_running_is_an_error() -> None:
    with pytest.raises(InternalError, match="not running"):
        StubProcess("m_0", "python3").send_now(p.Execute(1, []))
