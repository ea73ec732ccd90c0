"""Steps as rank 0 sends them to the other ranks: each row's block table as what changed.

Under tensor or pipeline parallelism every rank runs every step, so rank 0 sends each worker the
step's `StepPlan`. Its block tables are most of it: a row's table lists every KV block the
sequence holds (one per `block_size` tokens), so sending them whole costs every step bytes and
pickling in proportion to all the context held — 64 rows of 2,048 tokens in blocks of 16 are 8,192
block ids a step, for the one block a decode step adds now and then. As vLLM does, rank 0 sends
each row's change instead: how many blocks of the table the worker already holds for that
sequence stay, and the blocks appended after them. Both sides keep the tables last sent
(`TableSender` on rank 0, `TableMirror` on each worker) and forget a sequence once it finishes.

A preempted sequence loses its blocks and gets new ones when it runs again: its new table is no
extension of the one sent, so it goes whole (`kept` 0). Correct by construction either way: the
worker's table is the sent one's first `kept` blocks plus `added`, and rank 0 only keeps blocks
that its own copy shows are there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runner imports this module
    from naiad.llm.engine.model_runner import StepPlan


@dataclass(frozen=True, slots=True)
class RowTable:
    """One row's block table as a change to the one its sequence had at the last step sent."""

    seq_id: str
    kept: int  # leading blocks of the last table sent for `seq_id` that stay
    added: list[int]  # the blocks after them


@dataclass(frozen=True, slots=True)
class WireStep:
    """A step as rank 0 sends it: the plan without its block tables, the tables as changes, and
    the sequences that finished since the last step sent (whose tables the workers drop)."""

    plan: StepPlan  # block_tables empty
    tables: list[RowTable]
    finished: list[str]


class TableSender:
    """Rank 0's side: the tables the workers hold, and sequences finished since the last send."""

    def __init__(self) -> None:
        self._sent: dict[str, list[int]] = {}
        self._finished: list[str] = []

    def finished(self, seq_ids: Iterable[str]) -> None:
        """Sequences that finished: told to the workers with the next step (a step may have no
        rows, and then nothing is sent)."""
        self._finished.extend(seq_ids)

    def wire(self, plan: StepPlan, seq_ids: list[str]) -> WireStep:
        """`plan` (row `i` being sequence `seq_ids[i]`) as the workers are sent it."""
        finished, self._finished = self._finished, []
        for seq_id in finished:
            self._sent.pop(seq_id, None)
        rows = []
        for seq_id, table in zip(seq_ids, plan.block_tables, strict=True):
            sent = self._sent.get(seq_id)
            kept = len(sent) if sent is not None and sent == table[: len(sent)] else 0
            rows.append(RowTable(seq_id, kept, table[kept:]))
            self._sent[seq_id] = table
        return WireStep(dataclasses.replace(plan, block_tables=[]), rows, finished)

    def held(self) -> int:
        """How many sequences' tables the workers hold (for tests: finished ones are dropped)."""
        return len(self._sent)


class TableMirror:
    """A worker's side: rebuilds each step's full plan from what rank 0 sent."""

    def __init__(self) -> None:
        self._tables: dict[str, list[int]] = {}

    def plan(self, step: WireStep) -> StepPlan:
        for seq_id in step.finished:
            self._tables.pop(seq_id, None)
        tables = []
        for row in step.tables:
            held = self._tables.get(row.seq_id, [])
            if len(held) < row.kept:  # rank 0 and this rank disagree: a step was lost
                raise RuntimeError(f"sequence {row.seq_id!r}: rank 0 keeps {row.kept} blocks, this rank "
                                   f"holds {len(held)}")
            table = held[: row.kept] + row.added
            self._tables[row.seq_id] = table
            tables.append(table)
        return dataclasses.replace(step.plan, block_tables=tables)

    def held(self) -> int:
        return len(self._tables)
