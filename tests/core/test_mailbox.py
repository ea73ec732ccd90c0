"""Mailbox: the event loop's hand-over of a stream's items to one task."""

import asyncio

import pytest

from naiad.core.mailbox import Mailbox


def test_items_come_out_in_order_whether_put_before_or_while_waiting():
    async def run():
        box: Mailbox[int] = Mailbox()
        box.put(1)
        box.put(2)
        got = [await box.get(), await box.get()]
        waiting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        box.put(3)
        box.put(4)
        got.append(await waiting)
        got.append(await box.get())
        return got, len(box)

    assert asyncio.run(run()) == ([1, 2, 3, 4], 0)


def test_a_getter_cancelled_while_waiting_loses_no_item():
    async def run():
        box: Mailbox[str] = Mailbox()
        waiting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        box.put("kept")
        return await asyncio.wait_for(box.get(), 1)

    assert asyncio.run(run()) == "kept"


def test_an_item_put_in_the_same_turn_as_a_cancel_stays_for_the_next_getter():
    async def run():
        box: Mailbox[str] = Mailbox()
        waiting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        box.put("kept")  # wakes the getter's future ...
        waiting.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return await asyncio.wait_for(box.get(), 1)

    assert asyncio.run(run()) == "kept"
