import threading
import time

import pytest

from naiad.errors import InvalidArgument
from naiad.scheduling.rate_limiter import GLOBAL_DEVICE, Needs, RateLimiter


def _holder(limiter: RateLimiter, needs: Needs, log: list, name: str, hold: threading.Event):
    def run(jobs):
        log.append(("start", name))
        hold.wait(5)
        log.append(("end", name))

    return limiter.wrap(run, needs)


def test_instances_sharing_a_one_unit_resource_never_run_together():
    limiter = RateLimiter({("R", 0): 1})
    needs = Needs(((("R", 0), 1),))
    log: list = []
    hold = threading.Event()
    runners = [_holder(limiter, needs, log, n, hold) for n in ("a", "b")]
    threads = [threading.Thread(target=r, args=([],)) for r in runners]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    assert len([e for e in log if e[0] == "start"]) == 1  # the other waits for the unit
    hold.set()
    for thread in threads:
        thread.join(5)
    assert [e[0] for e in log] == ["start", "end", "start", "end"]


def test_an_unconfigured_resource_gets_the_largest_need():
    limiter = RateLimiter()
    limiter.register(Needs(((("R", 0), 2),)))
    limiter.register(Needs(((("R", 0), 3),)))
    limiter.acquire(Needs(((("R", 0), 3),)))  # would block forever if capacity were 2
    limiter.release(Needs(((("R", 0), 3),)))


def test_a_need_larger_than_the_configured_pool_is_refused():
    limiter = RateLimiter({("R", None): 2})
    with pytest.raises(InvalidArgument, match="needs 3 but only 2 are available"):
        limiter.register(Needs(((("R", 0), 3),)))


def test_lower_priority_value_goes_first():
    limiter = RateLimiter({("G", GLOBAL_DEVICE): 1})
    order: list[str] = []
    first = Needs(((("G", GLOBAL_DEVICE), 1),))
    limiter.acquire(first)  # hold the only unit while both wait

    def wait(name: str, priority: int) -> None:
        needs = Needs(((("G", GLOBAL_DEVICE), 1),), priority)
        limiter.acquire(needs)
        order.append(name)
        limiter.release(needs)

    threads = [threading.Thread(target=wait, args=("low", 5)), threading.Thread(target=wait, args=("high", 1))]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    time.sleep(0.05)
    limiter.release(first)
    for thread in threads:
        thread.join(5)
    assert order == ["high", "low"]
