"""The rate limiter: instances holding resources exclude each other, the lowest priority value
goes first, and nobody blocks (an instance that cannot have its resources is told when to retry)."""

import pytest

from naiad.errors import InvalidArgument
from naiad.scheduling.rate_limiter import GLOBAL_DEVICE, Needs, RateLimiter


class Waiter:
    """An instance trying to run: counts how often it was told to try again."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def ready(self) -> None:
        self.calls += 1


def test_instances_sharing_a_one_unit_resource_never_run_together():
    limiter = RateLimiter({("R", 0): 1})
    needs = Needs(((("R", 0), 1),))
    a, b = Waiter("a"), Waiter("b")
    assert limiter.try_acquire(needs, a, a.ready)
    assert not limiter.try_acquire(needs, b, b.ready)  # the other waits for the unit
    assert b.calls == 0
    limiter.release(needs)
    assert b.calls == 1  # told to try again once the unit is back
    assert limiter.try_acquire(needs, b, b.ready)
    assert not limiter.try_acquire(needs, a, a.ready)  # and now a waits for b
    limiter.release(needs)
    assert a.calls == 1


def test_an_unconfigured_resource_gets_the_largest_need():
    limiter = RateLimiter()
    limiter.register(Needs(((("R", 0), 2),)))
    limiter.register(Needs(((("R", 0), 3),)))
    big = Waiter("big")
    assert limiter.try_acquire(Needs(((("R", 0), 3),)), big, big.ready)  # impossible if capacity were 2
    limiter.release(Needs(((("R", 0), 3),)))


def test_a_need_larger_than_the_configured_pool_is_refused():
    limiter = RateLimiter({("R", None): 2})
    with pytest.raises(InvalidArgument, match="needs 3 but only 2 are available"):
        limiter.register(Needs(((("R", 0), 3),)))


def test_lower_priority_value_goes_first():
    limiter = RateLimiter({("G", GLOBAL_DEVICE): 1})
    first = Needs(((("G", GLOBAL_DEVICE), 1),))
    holder = Waiter("holder")
    assert limiter.try_acquire(first, holder, holder.ready)  # hold the only unit while both wait
    low, high = Waiter("low"), Waiter("high")
    low_needs, high_needs = Needs(((("G", GLOBAL_DEVICE), 1),), 5), Needs(((("G", GLOBAL_DEVICE), 1),), 1)
    assert not limiter.try_acquire(low_needs, low, low.ready)  # low came first ...
    assert not limiter.try_acquire(high_needs, high, high.ready)
    limiter.release(first)
    assert (high.calls, low.calls) == (1, 0)  # ... but high is first in line
    assert not limiter.try_acquire(low_needs, low, low.ready)  # low may not jump the line
    assert limiter.try_acquire(high_needs, high, high.ready)
    calls = low.calls
    limiter.release(high_needs)
    assert low.calls == calls + 1  # the unit is back: low, now first in line, is told
    assert limiter.try_acquire(low_needs, low, low.ready)
