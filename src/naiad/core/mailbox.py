"""`Mailbox`: items handed to one consumer task, all on the event loop's thread.

What a response stream needs of `asyncio.Queue` is a deque and one waiting future; the queue's
bookkeeping (its size limit, its putters, the loop looked up again on every call) is work done
for every streamed token that no stream needs. A profile of one LLM stream put asyncio.Queue's
methods at 30 % of the samples holding the GIL; replacing them, and a hop with them, took
6 % off the server's CPU per token (docs/benchmarks.md, 2026-12-07 07:10).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Unbounded; `put` and `get` on the event loop's thread only, one task waiting at a time.
    (What fills it is bounded elsewhere: a request's responses, held by its own stream.)"""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # a cancelled getter's future
                waiter.set_result(None)

    async def get(self) -> T:
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return items.popleft()

    def __len__(self) -> int:
        return len(self._items)
