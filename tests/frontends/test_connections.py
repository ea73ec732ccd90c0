"""ConnectionLimit (--max-connections): admission, the choice of the connection that makes room,
and the fit to the open-file limit."""

from __future__ import annotations

import asyncio
import resource
import time

import pytest

from naiad.frontends.connections import RESERVED_FILES, ConnectionLimit, IdleTimer, ReadPauses, fit_open_files


class Member:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_at_the_limit_a_newcomer_takes_the_place_of_a_never_used_connection_first() -> None:
    limit = ConnectionLimit(3)
    used, fresh, busy = Member("used"), Member("fresh"), Member("busy")
    for member in (used, fresh, busy):
        assert limit.admit(member)
    limit.busy(used)
    limit.idle(used)  # a pooled connection between two requests
    limit.busy(busy)
    newcomer = Member("new")
    assert limit.admit(newcomer) and fresh.evicted and not used.evicted
    limit.busy(newcomer)
    following = Member("next")
    assert limit.admit(following) and used.evicted  # then the one idle the longest
    limit.busy(following)
    assert not limit.admit(Member("refused"))  # everyone left is busy
    assert not busy.evicted and limit.members == {busy, newcomer, following}


def test_release_is_idempotent_and_frees_a_place() -> None:
    limit = ConnectionLimit(1)
    first = Member("first")
    assert limit.admit(first)
    limit.busy(first)
    assert not limit.admit(Member("second"))
    limit.release(first)
    limit.release(first)
    third = Member("third")
    assert limit.admit(third) and limit.members == {third}


def test_no_limit_admits_everyone() -> None:
    limit = ConnectionLimit(0)
    members = [Member(str(i)) for i in range(1000)]
    assert all(limit.admit(member) for member in members) and not any(m.evicted for m in members)


def test_the_limit_fits_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"soft": 1024, "hard": 2048}

    def getrlimit(kind: int) -> tuple[int, int]:
        return limits["soft"], limits["hard"]

    def setrlimit(kind: int, values: tuple[int, int]) -> None:
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert fit_open_files(1000) == 1000 and limits["soft"] == 1000 + RESERVED_FILES  # raised towards hard
    assert fit_open_files(4096) == 2048 - RESERVED_FILES  # not past the hard limit
    assert fit_open_files(0) == 0


def test_the_idle_timer_fires_once_idle_long_enough_and_never_while_busy() -> None:
    fired: list[float] = []

    async def main() -> None:
        timer = IdleTimer(0.05, lambda: fired.append(time.monotonic()))
        timer.idle()
        await asyncio.sleep(0.03)
        timer.busy()  # a request came: the armed timer finds it busy and stays quiet
        await asyncio.sleep(0.05)
        assert not fired
        timer.idle()
        started = time.monotonic()
        await asyncio.sleep(0.03)
        timer.idle()  # busy and idle again in between: timed from the last idle
        await asyncio.sleep(0.1)
        assert len(fired) == 1 and fired[0] - started >= 0.075

    asyncio.run(main())


def test_reading_resumes_only_when_the_last_reason_is_lifted() -> None:
    class Transport:
        reading = True

        def pause_reading(self) -> None:
            self.reading = False

        def resume_reading(self) -> None:
            self.reading = True

    pauses = ReadPauses()
    pauses.transport = Transport()  # type: ignore[assignment]
    pauses.pause("writes")
    pauses.pause("queue")
    pauses.resume("writes")
    assert not pauses.transport.reading  # type: ignore[union-attr]
    pauses.resume("queue")
    pauses.resume("queue")
    assert pauses.transport.reading  # type: ignore[union-attr]
