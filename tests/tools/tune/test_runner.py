"""The tuner's confirmation: start and best measured alternately, bounded by the time budget."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from naiad.config.model_config import ModelConfig
from naiad.tools.tune.runner import Tuner, TuneSettings
from naiad.tools.tune.search import Objective, Score
from naiad.tools.tune.space import llm_space

START = (("instances", 1),)
BEST = (("instances", 2),)


def confirm(deadline_in_s: float) -> tuple[list[Any], dict[str, list[Score]]]:
    tuner = Tuner(None, "m", TuneSettings(Objective(10.0), confirm_rounds=3), log=lambda *a: None)  # type: ignore[arg-type]
    order: list[Any] = []

    async def evaluate(cand: Any, warm: int, interval_s: float | None = None) -> tuple[Score, bool]:
        order.append(cand)
        return Score(True, 100.0 if cand == START else 200.0, 4, 5.0), True

    tuner._evaluate = evaluate  # type: ignore[method-assign]
    confirmed = asyncio.run(tuner._confirm(START, BEST, deadline=time.monotonic() + deadline_in_s))
    return order, confirmed


def test_confirmation_alternates_start_and_best_for_every_round_within_the_budget() -> None:
    order, confirmed = confirm(3600)
    assert order == [START, BEST] * 3
    assert tuner_choice(confirmed) == BEST


def test_confirmation_past_the_budget_keeps_one_round() -> None:
    order, confirmed = confirm(-1)  # the search used the whole budget
    assert order == [START, BEST]  # one round still: the verdict needs both in the same run
    assert len(confirmed["start"]) == len(confirmed["best"]) == 1


def tuner_choice(confirmed: dict[str, list[Score]]) -> Any:
    tuner = Tuner(None, "m", TuneSettings(Objective(10.0)))  # type: ignore[arg-type]
    return tuner._choose(START, BEST, confirmed)


def test_llm_probes_warm_a_reloaded_engine_once(monkeypatch: Any) -> None:
    from naiad.tools.loadgen.target import HttpTarget
    from naiad.tools.tune import runner

    warmups: list[int] = []

    class Figures:
        output_token_throughput = 50.0

        def stat(self, name: str) -> dict[str, float]:
            return {"p99": 100.0, "p50": 50.0}

    async def measure_llm(host: str, port: int, model: str, prompts: Any, c: int, requests: int,
                          warmup: int = 0) -> Figures:
        warmups.append(warmup)
        return Figures()

    async def load_model(model: str, config_json: str | None = None) -> None:
        return None

    monkeypatch.setattr(runner, "measure_llm", measure_llm)
    target = HttpTarget("127.0.0.1:1")  # nothing connects: measure_llm and load_model are replaced
    monkeypatch.setattr(target, "load_model", load_model)
    tuner = Tuner(target, "m", TuneSettings(Objective(10.0)), log=lambda *a: None)
    tuner.prompts = object()  # type: ignore[assignment]
    tuner.served = ModelConfig(name="m", backend="llm")
    tuner.dims, tuner.current = llm_space(tuner.served, ("max_num_seqs",))

    async def probes() -> None:
        await tuner._probe(2, tuner.windows)  # the served config, never measured: cold
        await tuner._probe(4, tuner.windows)
        await tuner._apply((("max_num_seqs", 128),))  # another config loaded
        await tuner._probe(4, tuner.windows)
        await tuner._probe(8, tuner.windows)

    asyncio.run(probes())
    assert warmups == [2, 0, 4, 0]  # one request per stream after each (re)load, none after
