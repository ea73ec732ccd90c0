"""Block tables sent as changes (naiad.llm.distributed.step_sync): every rank rebuilds rank 0's exact plan,
and a decode step's message no longer grows with the context held."""

from __future__ import annotations

import pickle
import random

import pytest

from naiad.llm.distributed.step_sync import RowTable, TableMirror, TableSender, WireStep
from naiad.llm.engine.model_runner import StepPlan


def _plan(tables: list[list[int]]) -> StepPlan:
    rows = len(tables)
    return StepPlan(list(range(rows)), list(range(rows)), [1] * rows, [16 * len(t) for t in tables],
                    [list(t) for t in tables], list(range(rows)))


def test_random_growth_preemption_and_finishing_rebuild_every_plan() -> None:
    """Sequences come and go, grow a block now and then, and are preempted (new blocks, some
    reused): the worker's plan equals rank 0's at every step, and finished ones are forgotten."""
    rng = random.Random(7)
    sender, mirror = TableSender(), TableMirror()
    live: dict[str, list[int]] = {}
    next_id = 0
    for _ in range(400):
        finished = [seq for seq in live if rng.random() < 0.05]
        for seq in finished:
            del live[seq]
        sender.finished(finished)
        while len(live) < 8 and rng.random() < 0.5:
            live[f"s{next_id}"] = [rng.randrange(1000) for _ in range(rng.randint(1, 4))]
            next_id += 1
        for seq, table in live.items():
            roll = rng.random()
            if roll < 0.3:
                table.append(rng.randrange(1000))
            elif roll < 0.35:  # preempted and rescheduled: new blocks, the first maybe reused
                live[seq] = table[:1] + [rng.randrange(1000) for _ in range(rng.randint(0, 3))]
        ids = [seq for seq in live if rng.random() < 0.8]  # some wait this step
        plan = _plan([live[seq] for seq in ids])
        assert mirror.plan(sender.wire(plan, ids)) == plan
    assert mirror.held() == sender.held() <= next_id


def test_a_decode_step_sends_only_the_new_blocks() -> None:
    sender = TableSender()
    tables = [list(range(i * 128, i * 128 + 128)) for i in range(64)]  # 64 rows of 2,048 tokens
    ids = [f"s{i}" for i in range(64)]
    first = pickle.dumps(sender.wire(_plan(tables), ids))
    tables[3].append(99_999)  # the next step: one row crossed into a new block
    step = sender.wire(_plan(tables), ids)
    assert [len(row.added) for row in step.tables] == [0, 0, 0, 1] + [0] * 60
    assert len(pickle.dumps(step)) < len(first) / 10
    whole = pickle.dumps(_plan(tables))  # what every step cost before
    assert len(pickle.dumps(step)) < len(whole) / 10


def test_a_worker_that_missed_a_step_says_so() -> None:
    mirror = TableMirror()
    step = WireStep(_plan([[]]), [RowTable("s0", 2, [5])], [])
    with pytest.raises(RuntimeError, match="rank 0 keeps 2 blocks"):
        mirror.plan(step)
