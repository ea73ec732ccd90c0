"""`naiad tune` against a live server: apply each candidate through the repository API (no
restart), measure it with the load-generation core, search, confirm, and restore.

The confirmation re-measures the starting config and the best one alternately with longer
windows (`confirm_rounds` each), so the verdict "better than what you had" comes from the same
run and the same machine state; when the best does not beat the start there, the start is kept.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.config.model_config import ModelConfig, config_to_json
from naiad.tools.loadgen.llm import LlmSettings, PromptMaker, measure_llm
from naiad.tools.loadgen.measure import MeasureError, WindowSettings
from naiad.tools.loadgen.plan import DataSettings, RequestPlan, make_plan
from naiad.tools.loadgen.run import LoadLevel, run_level
from naiad.tools.loadgen.spec import config_message
from naiad.tools.loadgen.target import HttpTarget, Target, TargetError
from naiad.tools.tune.search import Objective, Probe, Score, Search, Trial, score_config
from naiad.tools.tune.space import Candidate, Dimension, SpaceOptions, apply, llm_space, model_space, only_in_place

SEARCH_SHARE = 0.7  # of the time budget; the rest is for the confirmation


@dataclass(frozen=True)
class TuneSettings:
    objective: Objective
    time_budget_s: float = 280.0  # the search stops at SEARCH_SHARE of it; confirmation rounds after the first
    # stop at the whole of it (a trial or round under way always finishes: the run can overrun it)
    interval_s: float = 1.0  # measurement window while searching
    min_requests: int = 30  # a window also waits for this many answers (slow models)
    max_concurrency: int = 64
    margin: float = 0.03
    warmup_s: float = 0.3
    confirm_rounds: int = 2
    confirm_interval_s: float = 2.0
    space: SpaceOptions = field(default_factory=SpaceOptions)
    data: DataSettings = field(default_factory=DataSettings)
    llm: LlmSettings | None = None  # set for LLM models: tokens/s under the objective
    llm_metric: str = "ttft_ms"  # the per-request figure whose p99 the objective bounds
    llm_requests_per_stream: int = 4
    llm_dimensions: tuple[str, ...] = ("max_num_seqs", "max_num_batched_tokens")


@dataclass
class TuneResult:
    model: str
    objective: Objective
    dims: list[Dimension]
    start: Candidate
    best: Candidate
    trials: list[Trial]
    confirmed: dict[str, list[Score]]  # "start" / "best" -> confirmation scores
    chosen: Candidate
    served_config: ModelConfig
    elapsed_s: float
    search_s: float
    notes: list[str] = field(default_factory=list)

    def confirmed_throughput(self, which: str) -> float:
        scores = [s for s in self.confirmed.get(which, []) if s.feasible]
        return statistics.median(s.throughput for s in scores) if scores else 0.0


class Tuner:
    """Drives one model on one target through the search."""

    def __init__(self, target: Target, model: str, settings: TuneSettings, log: Any = print) -> None:
        self.target, self.model, self.settings, self.log = target, model, settings, log
        self.plan: RequestPlan | None = None
        self.prompts: PromptMaker | None = None
        self.served: ModelConfig | None = None
        self.dims: list[Dimension] = []
        self.current: Candidate | None = None
        self._measured = False  # a config has been measured: later request failures belong to that config
        self._cold = True  # the loaded config has answered no request yet (LLM probes warm it up first)
        self.windows = WindowSettings(interval_s=settings.interval_s, request_count=settings.min_requests,
                                      stability_pct=15.0, max_trials=3, stable_windows=2)

    async def run(self) -> TuneResult:
        started = time.monotonic()
        self.served = config_message(await self.target.model_config(self.model))
        try:  # the served config loaded again changes nothing: it checks that loads are allowed
            await self.target.load_model(self.model, json.dumps(config_to_json(self.served)))
        except TargetError as error:
            raise TargetError(f"the server refused a config load ({error}); tune needs a server in explicit "
                              "model control (--model-control-mode explicit) that serves this model's "
                              "repository") from None
        if self.settings.llm is not None:
            self.dims, start = llm_space(self.served, self.settings.llm_dimensions)
            if not isinstance(self.target, HttpTarget):
                raise TargetError("LLM models are tuned over the OpenAI API: use the HTTP protocol")
            self.prompts = PromptMaker(self.settings.llm)
            await self.prompts.calibrate(self.target.control, self.model)
        else:
            self.dims, start = model_space(self.served, self.settings.space)
            self.plan = await make_plan(self.target, self.model, "", self.settings.data)
        self.current = start
        search = Search(self.dims, start, self._evaluate, self.settings.margin,
                        deadline=started + SEARCH_SHARE * self.settings.time_budget_s, on_trial=self._report_trial)
        try:
            best, _ = await search.run()
            search_s = time.monotonic() - started
            confirmed = await self._confirm(start, best, deadline=started + self.settings.time_budget_s)
            chosen = self._choose(start, best, confirmed)
        finally:
            await self._restore()
            if self.plan is not None:
                await self.plan.close()
        return TuneResult(self.model, self.settings.objective, self.dims, start, best, search.trials, confirmed,
                          chosen, self.served, time.monotonic() - started, search_s)

    # -- applying and measuring ------------------------------------------------------------

    async def _apply(self, cand: Candidate) -> bool:
        """Load `cand` (a no-op when it is what is loaded); whether it was in place."""
        assert self.served is not None and self.current is not None
        in_place = only_in_place(self.dims, self.current, cand)
        if cand != self.current:
            config = apply(self.served, self.dims, cand)
            await self.target.load_model(self.model, json.dumps(config_to_json(config)))
            self.current = cand
            self._cold = True
        return in_place

    async def _evaluate(self, cand: Candidate, warm: int, interval_s: float | None = None) -> tuple[Score, bool]:
        try:
            in_place = await self._apply(cand)
        except TargetError as error:
            return Score.failed(str(error)), False
        windows = self.windows if interval_s is None else WindowSettings(
            interval_s=interval_s, request_count=self.settings.min_requests, stability_pct=15.0, max_trials=3,
            stable_windows=2)

        async def probe(c: int) -> Probe:
            return await self._probe(c, windows)

        try:
            score = await score_config(probe, self.settings.objective, warm, self.settings.max_concurrency)
        except (MeasureError, TargetError) as error:
            if not self._measured:  # the served config itself fails: the data or the model, not a setting
                raise TargetError(f"requests to the model's current config fail ({error}); tune measures "
                                  "nothing until they succeed (check the data: --shape, --input-data)") from None
            return Score.failed(f"requests failed: {error}"), in_place
        self._measured = True
        return score, in_place

    async def _probe(self, c: int, windows: WindowSettings) -> Probe:
        if self.prompts is not None:
            assert isinstance(self.target, HttpTarget)
            # A reloaded engine's first requests pay its start-up (allocation, first kernels): with
            # a few requests per probe, one of them would be the p99. One stream's worth warms it.
            warmup, self._cold = (c if self._cold else 0), False
            llm = await measure_llm(self.target.host, self.target.port, self.model, self.prompts, c,
                                    max(4, self.settings.llm_requests_per_stream * c), warmup=warmup)
            stat = llm.stat(self.settings.llm_metric)
            return Probe(c, llm.output_token_throughput, stat["p99"], stat["p50"])
        assert self.plan is not None
        m = await run_level(self.plan, LoadLevel("concurrency", c), windows, warmup_s=self.settings.warmup_s)
        return Probe(c, m.throughput, m.latency_us(99) / 1000.0, m.latency_us(50) / 1000.0, m.stable)

    def _report_trial(self, trial: Trial) -> None:
        from naiad.tools.tune.space import describe

        s = trial.score
        if s.error:
            outcome = f"refused: {s.error[:160]}"
        else:
            where = f"c={s.concurrency}, p99 {s.p99_ms:.2f} ms"
            outcome = (f"{s.throughput:,.1f}/s at {where}" if s.feasible
                       else f"objective not met (best p99 {s.p99_ms:.2f} ms at c={s.concurrency})")
        how = "in place" if trial.in_place else "reload"
        self.log(f"[{trial.index + 1:>2}] {describe(trial.candidate)} ({how}, {trial.seconds:.1f} s): {outcome}")

    # -- confirmation and restore ----------------------------------------------------------

    async def _confirm(self, start: Candidate, best: Candidate, deadline: float) -> dict[str, list[Score]]:
        """`confirm_rounds` rounds of (start, best); rounds after the first only while before `deadline`."""
        confirmed: dict[str, list[Score]] = {"start": [], "best": []}
        if best == start or self.settings.confirm_rounds <= 0:
            return confirmed
        self.log(f"confirming: the start and the best, alternately, {self.settings.confirm_rounds} round(s) each")
        for round_ in range(self.settings.confirm_rounds):
            if round_ > 0 and time.monotonic() >= deadline:
                self.log(f"  time budget spent: {round_} round(s) confirmed")
                break
            for which, cand in (("start", start), ("best", best)):
                previous = confirmed[which][-1].concurrency if confirmed[which] else 1
                score, _ = await self._evaluate(cand, previous, self.settings.confirm_interval_s)
                confirmed[which].append(score)
                self.log(f"  {which}: {score.throughput:,.1f}/s at c={score.concurrency}, p99 {score.p99_ms:.2f} ms"
                         + ("" if score.feasible else " (objective not met)"))
        return confirmed

    def _choose(self, start: Candidate, best: Candidate, confirmed: dict[str, list[Score]]) -> Candidate:
        """The best, unless the start did as well in the confirmation (medians of its rounds)."""
        if best == start or not confirmed["best"]:
            return best
        median = {k: statistics.median(s.throughput if s.feasible else 0.0 for s in v) for k, v in confirmed.items()}
        return best if median["best"] > median["start"] else start

    async def _restore(self) -> None:
        """Put the served config back as it was before the search."""
        if self.served is None:
            return
        try:
            await self.target.load_model(self.model, json.dumps(config_to_json(self.served)))
        except TargetError as error:
            self.log(f"warning: could not restore the original config: {error}")


def write_best_config(result: TuneResult, file_config: ModelConfig, path: Path) -> None:
    """The model's own config.pbtxt with the chosen values written in."""
    from naiad.config.model_config import config_to_pbtxt

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_to_pbtxt(apply(file_config, result.dims, result.chosen)))
