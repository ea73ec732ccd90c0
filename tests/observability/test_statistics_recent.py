"""The latency window the web console reads: kept only while watched, bounded, read by time."""

from __future__ import annotations

import time

from naiad.observability.statistics import RECENT_MAX_REQUESTS, ModelStatistics


def test_unwatched_versions_keep_nothing() -> None:
    stats = ModelStatistics("m", "1")
    stats.record_request(True, 1000, 100, (10, 20, 30))
    assert stats.recent is None
    assert stats.recent_since(0) == []


def test_watched_requests_are_kept_with_their_phases() -> None:
    stats = ModelStatistics("m", "1")
    stats.watch_recent(True)
    before = time.monotonic_ns()
    stats.record_request(True, 1000, 100, (10, 20, 30))
    stats.record_request(False, 5000, 0, (0, 0, 0))  # failures are not latencies
    stats.record_cache_hit(400, 50, 7)
    rows = stats.recent_since(before)
    assert [row[1:] for row in rows] == [(1000, 100, 60), (400, 50, 0)]
    assert all(row[0] >= before for row in rows)
    assert stats.recent_since(time.monotonic_ns() + 1) == []


def test_the_window_is_bounded_and_keeps_the_newest() -> None:
    stats = ModelStatistics("m", "1")
    stats.watch_recent(True)
    for i in range(RECENT_MAX_REQUESTS + 10):
        stats.record_request(True, i, 0, (0, 0, 0))
    rows = stats.recent_since(0)
    assert len(rows) == RECENT_MAX_REQUESTS
    assert rows[-1][1] == RECENT_MAX_REQUESTS + 9 and rows[0][1] == 10


def test_watching_again_keeps_the_window_and_stopping_drops_it() -> None:
    stats = ModelStatistics("m", "1")
    stats.watch_recent(True)
    stats.record_request(True, 1, 0, (0, 0, 0))
    stats.watch_recent(True)
    assert len(stats.recent_since(0)) == 1
    stats.watch_recent(False)
    assert stats.recent is None


def test_batch_counts() -> None:
    stats = ModelStatistics("m", "1")
    stats.record_execution(4, 1, 2, 3)
    stats.record_execution(4, 1, 2, 3)
    stats.record_execution(1, 1, 2, 3)
    assert stats.batch_counts() == {4: 2, 1: 1}
