"""Run calls in client threads, started a little apart so their arrival order is known."""

from __future__ import annotations

import threading
import time
from typing import Any


def in_threads(*calls: Any, stagger: float = 0.05) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Any) -> None:
        try:
            results[i] = call()
        except Exception as error:  # collected and asserted on by the test
            results[i] = error

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
        time.sleep(stagger)  # arrival order is part of what these tests check
    for thread in threads:
        thread.join(30)
    return results
