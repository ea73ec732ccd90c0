"""The search of `naiad tune` on a fake model whose best config is known (an analytic latency and
throughput model), and its concurrency search on known curves."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest

from naiad.config.model_config import parse_config_text
from naiad.tools.tune.search import Objective, Probe, Score, Search, better, pareto, score_config
from naiad.tools.tune.space import OFF, SpaceOptions, as_dict, candidate, model_space

CONFIG = parse_config_text("""
name: "fake" backend: "python" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""", "test")
OPTIONS = SpaceOptions(max_instances=4, max_batch_sizes=(1, 2, 4, 8, 16, 32, 64),
                       queue_delays_us=(OFF, 0, 500, 2000), preferred=("none", "max"))
OBJECTIVE = Objective(p99_ms=8.0)
MAX_C = 64


def fake_probe(values: dict[str, Any], c: int) -> Probe:
    """Two cores: a third instance slows every one; batches amortize a fixed cost; a queue
    delay waits for fuller batches; a preferred size cuts a little of each batch's cost."""
    n, size = values["instances"], values["max_batch_size"]
    batching = values["queue_delay_us"] != OFF and size > 1
    per_instance = math.ceil(c / n)
    rows = min(size, per_instance) if batching else 1
    slowdown = 1.0 if n <= 2 else 1.0 + 0.6 * (n - 2)
    batch_ms = (1.0 + 0.1 * rows) * slowdown
    if batching:
        batch_ms *= 0.95 if values["preferred"] == "max" else 1.0
        batch_ms += values["queue_delay_us"] / 1000.0 * 0.1
    throughput = min(n, c) * rows / batch_ms * 1000.0  # fewer clients than instances leave some idle
    p99 = math.ceil(per_instance / rows) * batch_ms * 1.3
    return Probe(c, throughput, p99)


def evaluate_with(counter: list[Any], refuse_above: int | None = None) -> Any:
    async def evaluate(cand: Any, warm: int) -> tuple[Score, bool]:
        values = as_dict(cand)
        counter.append(cand)
        if refuse_above is not None and values["max_batch_size"] > refuse_above:
            return Score.failed("load failed: max_batch_size too large for the model"), False

        async def probe(c: int) -> Probe:
            return fake_probe(values, c)

        return await score_config(probe, OBJECTIVE, warm, MAX_C), False

    return evaluate


def grid_optimum(dims: list[Any], refuse_above: int | None = None) -> tuple[dict[str, Any], float]:
    """The best config by brute force over the whole grid (what the search must find)."""
    best, best_value = None, -1.0
    for combo in itertools.product(*(d.values for d in dims)):
        values = {d.name: v for d, v in zip(dims, combo, strict=True)}
        if refuse_above is not None and values["max_batch_size"] > refuse_above:
            continue

        async def probe(c: int, values: dict[str, Any] = values) -> Probe:
            return fake_probe(values, c)

        score = asyncio.run(score_config(probe, OBJECTIVE, 1, MAX_C))
        if score.feasible and score.throughput > best_value:
            best, best_value = values, score.throughput
    assert best is not None
    return best, best_value


def test_the_search_finds_the_known_optimum_measuring_a_fraction_of_the_grid() -> None:
    dims, start = model_space(CONFIG, OPTIONS)
    grid = math.prod(len(d.values) for d in dims)
    optimum, optimum_value = grid_optimum(dims)
    evaluated: list[Any] = []
    best, score = asyncio.run(Search(dims, start, evaluate_with(evaluated), margin=0.0).run())
    assert score.feasible
    assert score.throughput == pytest.approx(optimum_value)
    assert as_dict(best)["instances"] == optimum["instances"] == 2  # the third instance's slowdown costs more
    assert len(evaluated) < grid / 4, f"{len(evaluated)} of {grid} configs measured: not pruned"
    assert len(set(evaluated)) == len(evaluated), "a config was measured twice"


def test_refused_configs_end_their_direction() -> None:
    dims, start = model_space(CONFIG, OPTIONS)
    _optimum, optimum_value = grid_optimum(dims, refuse_above=16)
    evaluated: list[Any] = []
    best, score = asyncio.run(Search(dims, start, evaluate_with(evaluated, refuse_above=16), margin=0.0).run())
    assert as_dict(best)["max_batch_size"] <= 16
    assert score.throughput == pytest.approx(optimum_value)
    refused = [c for c in evaluated if as_dict(c)["max_batch_size"] > 16]
    assert len(refused) <= 3  # one refusal per climb, never the sizes beyond it


def test_the_time_budget_stops_the_search() -> None:
    dims, start = model_space(CONFIG, OPTIONS)
    evaluated: list[Any] = []
    search = Search(dims, start, evaluate_with(evaluated), deadline=0.0)  # already past
    best, _ = asyncio.run(search.run())
    assert best == start
    assert evaluated == [start]  # the start is always measured


def test_noise_below_the_margin_does_not_move_the_search() -> None:
    dims, start = model_space(CONFIG, OPTIONS)

    async def flat(cand: Any, warm: int) -> tuple[Score, bool]:
        jitter = 1.0 + 0.01 * (hash(cand) % 3 - 1)  # +-1 %: noise, not an improvement
        return Score(True, 1000.0 * jitter, 4, 5.0), False

    best, _ = asyncio.run(Search(dims, start, flat, margin=0.03).run())
    assert best == start


# ----------------------------------------------------------------------------- concurrency search


def curve(capacity: float, base_ms: float) -> Any:
    """A server with `capacity` requests/s: latency grows with the queue once it saturates."""

    async def probe(c: int) -> Probe:
        throughput = min(c / base_ms * 1000.0, capacity)
        return Probe(c, throughput, c / throughput * 1000.0)

    return probe


def queueing(base_ms: float, per_client_ms: float) -> Any:
    """Each client adds queueing: latency grows linearly, throughput keeps growing (saturating)."""

    async def probe(c: int) -> Probe:
        latency = base_ms + per_client_ms * c
        return Probe(c, c / latency * 1000.0, latency)

    return probe


def test_latency_objective_finds_the_largest_feasible_concurrency() -> None:
    # latency 2 + 0.5 c ms: p99 <= 11 ms holds up to c=18 (16 and 32 probed, then bisected).
    score = asyncio.run(score_config(queueing(2.0, 0.5), Objective(11.0), 1, 64, bisections=4))
    assert score.feasible
    assert score.concurrency == 18
    assert score.p99_ms <= 11.0


def test_the_concurrency_search_starts_warm_and_goes_down_when_over() -> None:
    score = asyncio.run(score_config(queueing(2.0, 0.5), Objective(11.0), 64, 64, bisections=4))
    assert score.concurrency == 18
    assert min(p.concurrency for p in score.probes) == 16  # halved from 64 until the objective held


def test_throughput_objective_stops_at_the_plateau() -> None:
    score = asyncio.run(score_config(curve(1000.0, 2.0), Objective(None), 1, 64))
    assert score.throughput == pytest.approx(1000.0)
    assert max(p.concurrency for p in score.probes) <= 4  # c=2 reached capacity, c=4 added nothing


def test_an_unreachable_objective_is_infeasible_with_the_lowest_latency() -> None:
    score = asyncio.run(score_config(curve(1000.0, 2.0), Objective(1.0), 8, 64))
    assert not score.feasible
    assert score.concurrency == 1
    assert score.p99_ms == pytest.approx(2.0)


def test_better_prefers_feasible_then_throughput_beyond_the_margin() -> None:
    feasible, infeasible = Score(True, 100.0, 1, 5.0), Score(False, 500.0, 1, 50.0)
    assert better(feasible, infeasible, 0.03)
    assert not better(Score(True, 102.0, 1, 5.0), feasible, 0.03)
    assert better(Score(True, 104.0, 1, 5.0), feasible, 0.03)
    assert not better(Score.failed("refused"), infeasible, 0.03)


def test_pareto_front_keeps_the_points_nothing_beats() -> None:
    points = [(5.0, 100.0, "a"), (6.0, 90.0, "b"), (7.0, 150.0, "c"), (4.0, 50.0, "d"), (7.0, 120.0, "e")]
    assert [tag for _, _, tag in pareto(points)] == ["d", "a", "c"]


def test_start_candidate_is_the_config() -> None:
    _dims, start = model_space(CONFIG, OPTIONS)
    assert start == candidate({"instances": 1, "max_batch_size": 8, "queue_delay_us": OFF, "preferred": "none"})
