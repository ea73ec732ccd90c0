"""How one request picks its next token: the sampler's per-request settings (no torch here).

Validated when built, so a bad value is a 400 before anything is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

from naiad.errors import InvalidArgument

#: Below this temperature a request is greedy: dividing logits by ~0 only overflows (as vLLM).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Temperature, then top-k, top-p and min-p filtering, then a draw from what is left.

    `temperature` 0 is greedy (argmax; the filters do not matter then). `top_k` 0 keeps every
    token; `top_p` 1 keeps the whole nucleus; `min_p` 0 keeps tokens of any probability.
    `seed` makes the request's draws reproducible whatever it is batched with; None draws from
    the runner's shared generator.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # `not (x >= lo)` rather than `x < lo` so that NaN is rejected too.
        if not self.temperature >= 0:
            raise InvalidArgument(f"temperature must be at least 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgument(f"top_k must be an integer of at least 0 (0 keeps all tokens), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidArgument(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidArgument(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def filters(self) -> bool:
        """Whether any of top-k, top-p and min-p removes tokens."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0


GREEDY = SamplingParams(temperature=0.0)
