"""How gRPC slots share HTTP/2 connections: as perf_analyzer's one shared channel by default (a
connection per call would make the server pay a read and a write per call), split at the
server's stream limit or at --grpc-streams-per-connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from naiad.tools.loadgen import target as target_module
from naiad.tools.loadgen.target import GrpcTarget, make_target


def connections_for(slots: int, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> list[int]:
    """How many slots each connection carries after opening `slots` slots."""
    opened: list[object] = []

    async def connect(host: str, port: int, done: Any, metadata: Any) -> object:
        opened.append(object())
        return opened[-1]

    monkeypatch.setattr(target_module.h2, "connect", connect)
    grpc = make_target("grpc", "localhost:8001", **kwargs)
    assert isinstance(grpc, GrpcTarget)
    asyncio.run(grpc.open_slots(slots, lambda index: [b""], lambda *args: None))
    return [sum(slot.conn is conn for slot in grpc.slots) for conn in opened]


def test_by_default_slots_share_one_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections_for(32, monkeypatch) == [32]


def test_by_default_a_connection_carries_at_most_100_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections_for(256, monkeypatch) == [100, 100, 56]


def test_streams_per_connection_splits_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections_for(10, monkeypatch, streams_per_connection=4) == [4, 4, 2]
    assert connections_for(3, monkeypatch, streams_per_connection=1) == [1, 1, 1]
