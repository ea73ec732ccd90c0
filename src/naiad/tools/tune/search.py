"""The search of `naiad tune`: coordinate ascent over config dimensions, and a concurrency search
per config. Pure logic over an injected measurement, so it is tested with a fake model whose
best config is known.

- **Score of a config**: under a latency objective (`p99_ms`), the highest throughput among the
  client concurrencies whose p99 stays within it; under a throughput objective, the highest
  throughput. Concurrency doubles from a warm start (the best so far) while the objective holds
  and throughput still grows (a plateau stops it), halves when the objective fails, then bisects
  once or twice between the last good and the first bad level.
- **Search**: starting from the model's own config, one dimension at a time, step to a neighbour
  value; keep stepping the same way while each step beats the best by more than `margin` (noise),
  stop at the first step that does not (the curve is taken as unimodal along a dimension, which
  prunes the rest of that direction), and try the other direction only when the first found
  nothing. Dimensions that do not matter in a config (preferred sizes with batching off) are
  skipped; a config the server refuses to load ends its direction. Passes repeat until one
  improves nothing or the time budget runs out. Nothing is measured twice.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from naiad.tools.tune.space import Candidate, Dimension, as_dict, candidate


@dataclass(frozen=True, slots=True)
class Probe:
    """One measurement of a config at one client concurrency."""

    concurrency: int
    throughput: float
    p99_ms: float
    p50_ms: float = 0.0
    stable: bool = True


@dataclass(frozen=True, slots=True)
class Objective:
    p99_ms: float | None = None  # None: the highest throughput, whatever the latency

    def feasible(self, probe: Probe) -> bool:
        return self.p99_ms is None or probe.p99_ms <= self.p99_ms

    def __str__(self) -> str:
        return "max throughput" if self.p99_ms is None else f"max throughput with p99 <= {self.p99_ms:g} ms"


@dataclass(frozen=True)
class Score:
    """What a config achieves under the objective, and every probe that found it out."""

    feasible: bool
    throughput: float
    concurrency: int
    p99_ms: float
    probes: tuple[Probe, ...] = ()
    error: str = ""  # the server refused the config

    @classmethod
    def failed(cls, error: str) -> Score:
        return cls(False, 0.0, 0, float("inf"), (), error)


def better(a: Score, b: Score, margin: float) -> bool:
    """Whether `a` beats `b` by more than the noise margin."""
    if a.error:
        return False
    if b.error:
        return True
    if a.feasible != b.feasible:
        return a.feasible
    if a.feasible:
        return a.throughput > b.throughput * (1.0 + margin)
    return a.p99_ms < b.p99_ms * (1.0 - margin)


ProbeAt = Callable[[int], Awaitable[Probe]]


async def score_config(probe: ProbeAt, objective: Objective, start: int, max_concurrency: int,
                       plateau: float = 0.03, bisections: int = 2) -> Score:
    """The config's score, probing as few concurrencies as the search below needs."""
    seen: dict[int, Probe] = {}

    async def at(c: int) -> Probe:
        if c not in seen:
            seen[c] = await probe(c)
        return seen[c]

    good, bad = None, None
    c = max(1, min(start, max_concurrency))
    if objective.feasible(await at(c)):
        good = c
        while good < max_concurrency:
            nxt = min(max_concurrency, good * 2)
            if not objective.feasible(await at(nxt)):
                bad = nxt
                break
            grew = seen[nxt].throughput > seen[good].throughput * (1.0 + plateau)
            good = nxt
            if not grew:
                break  # more clients only queue longer
    else:
        bad = c
        while c > 1:
            c = max(1, c // 2)
            if objective.feasible(await at(c)):
                good = c
                break
            bad = c
    for _ in range(bisections):
        if good is None or bad is None or bad - good <= 1:
            break
        mid = (good + bad) // 2
        if objective.feasible(await at(mid)):
            good = mid
        else:
            bad = mid
    probes = tuple(seen[c] for c in sorted(seen))
    feasible = [p for p in probes if objective.feasible(p)]
    if not feasible:
        lowest = min(probes, key=lambda p: p.p99_ms)
        return Score(False, lowest.throughput, lowest.concurrency, lowest.p99_ms, probes)
    best = max(feasible, key=lambda p: p.throughput)
    return Score(True, best.throughput, best.concurrency, best.p99_ms, probes)


@dataclass(frozen=True)
class Trial:
    """One config the search measured, in order."""

    index: int
    candidate: Candidate
    score: Score
    seconds: float  # applying and measuring it
    in_place: bool  # applied without reloading the model


#: evaluate(candidate, start_concurrency) -> (score, in_place)
Evaluate = Callable[[Candidate, int], Awaitable[tuple[Score, bool]]]


@dataclass
class Search:
    dims: list[Dimension]
    start: Candidate
    evaluate: Evaluate
    margin: float = 0.03
    max_passes: int = 3
    deadline: float | None = None  # time.monotonic() after which no new config is tried
    on_trial: Callable[[Trial], None] | None = None
    trials: list[Trial] = field(default_factory=list)
    _cache: dict[Candidate, Score] = field(default_factory=dict)

    def key(self, cand: Candidate) -> Candidate:
        """The candidate with the dimensions that do not matter in it left out (equal configs, one key)."""
        values = as_dict(cand)
        return candidate({d.name: values[d.name] for d in self.dims if d.name in values and d.active(values)})

    @property
    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    async def score(self, cand: Candidate, warm: int) -> Score:
        key = self.key(cand)
        if key not in self._cache:
            started = time.monotonic()
            score, in_place = await self.evaluate(cand, warm)
            self._cache[key] = score
            trial = Trial(len(self.trials), cand, score, time.monotonic() - started, in_place)
            self.trials.append(trial)
            if self.on_trial is not None:
                self.on_trial(trial)
        return self._cache[key]

    async def run(self) -> tuple[Candidate, Score]:
        """The best candidate found and its score (the start's when nothing beat it)."""
        best = self.start
        best_score = await self.score(best, 1)
        for _ in range(self.max_passes):
            improved = False
            for dim in self.dims:
                if self.out_of_time:
                    return best, best_score
                if not dim.active(as_dict(best)):
                    continue
                found, score = await self._climb(dim, best, best_score)
                if found != best:
                    best, best_score, improved = found, score, True
            if not improved:
                break
        return best, best_score

    async def _climb(self, dim: Dimension, best: Candidate, best_score: Score) -> tuple[Candidate, Score]:
        values = as_dict(best)
        index = dim.values.index(values[dim.name])
        for step in (1, -1):
            found, found_score = best, best_score
            i = index + step
            while 0 <= i < len(dim.values) and not self.out_of_time:
                cand = candidate({**as_dict(found), dim.name: dim.values[i]})
                score = await self.score(cand, max(1, found_score.concurrency))
                if not better(score, found_score, self.margin):
                    break  # no better (or refused): the rest of this direction is pruned
                found, found_score = cand, score
                i += step
            if found != best:
                return found, found_score
        return best, best_score


def pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points (latency, throughput, tag) no other point beats on both: lower latency and
    higher throughput. Sorted by latency."""
    front: list[tuple[float, float, Any]] = []
    for point in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or point[1] > front[-1][1]:
            front.append(point)
    return front


def as_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
