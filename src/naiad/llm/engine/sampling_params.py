"""How one request picks its next token: the sampler's per-request settings (no torch here).

Validated when built, so a bad value is a 400 before anything is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

from naiad.errors import InvalidArgument

#: Below this temperature a request is greedy: dividing logits by ~0 only overflows (as vLLM).
GREEDY_TEMPERATURE = 1e-5
#: The most top alternatives a request may ask logprobs for (as OpenAI's top_logprobs).
MAX_LOGPROBS = 20
#: logit_bias values lie in [-100, 100], as OpenAI's
MAX_LOGIT_BIAS = 100
#: structured outputs' grammars (naiad.llm.engine.guided)
GUIDE_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
#: how an embedding request pools the prompt's final hidden states
POOLING = ("last", "mean")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Temperature, then top-k, top-p and min-p filtering, then a draw from what is left.

    `temperature` 0 is greedy (argmax; the filters do not matter then). `top_k` 0 keeps every
    token; `top_p` 1 keeps the whole nucleus; `min_p` 0 keeps tokens of any probability.
    `seed` makes the request's draws reproducible whatever it is batched with; None draws from
    the runner's shared generator.

    Penalties change the logits before anything else (greedy rows too), as vLLM:
    `repetition_penalty` (1 is off) divides the positive logits and multiplies the negative ones
    of every token in the prompt or the output so far; `frequency_penalty` subtracts itself
    times the number of times a token was generated, `presence_penalty` itself once for every
    token generated at least once (OpenAI's definitions; 0 is off). `logprobs` N (None is off)
    returns the log-softmax of the raw logits for the sampled token and the N most likely
    ones. For the first `min_tokens` output tokens the end-of-sequence and `stop_token_ids`
    tokens cannot be drawn; a `stop_token_ids` token ends the sequence like end-of-sequence.
    `logit_bias` adds (token id, bias) pairs to the logits after the penalties (OpenAI's
    logit_bias: -100 to 100; -100 all but bans a token, 100 all but forces it).
    `prompt_logprobs` N (None is off) also returns, for every prompt token after the first,
    its logprob given the tokens before it and the N most likely there (vLLM's prompt_logprobs;
    such a request is not served from the prefix cache, whose tokens have no logits).
    `pooling` ("last" or "mean"; None is off) makes the request an embedding instead: no token
    is drawn, and the output is the final hidden state (after the last norm) of the prompt's last
    token, or the mean over all its tokens, L2-normalized (a mean-pooled request is not served
    from the prefix cache: every token's hidden state is needed).
    `guide` (kind, spec) holds the output to a grammar: a JSON schema, any JSON object, a
    regex, one of a list of choices or a Lark grammar (`naiad.llm.engine.guided`).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    guide: tuple[str, str] | None = None
    prompt_logprobs: int | None = None
    pooling: str | None = None

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
        if isinstance(self.repetition_penalty, bool) or not self.repetition_penalty > 0 \
                or self.repetition_penalty == float("inf"):
            raise InvalidArgument(
                f"repetition_penalty must be a number above 0 (1 is off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not -2 <= value <= 2:
                raise InvalidArgument(f"{name} must be in [-2, 2], got {value}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InvalidArgument(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise InvalidArgument(
                f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidArgument(f"min_tokens must be an integer of at least 0, got {self.min_tokens!r}")
        if not isinstance(self.stop_token_ids, tuple) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise InvalidArgument(
                f"stop_token_ids must be token ids (integers of at least 0), got {self.stop_token_ids!r}")

        for pair in self.logit_bias:
            if len(pair) != 2 or not _is_int(pair[0]) or pair[0] < 0 or isinstance(pair[1], bool) \
                    or not isinstance(pair[1], int | float) or not -MAX_LOGIT_BIAS <= pair[1] <= MAX_LOGIT_BIAS:
                raise InvalidArgument(f"logit_bias maps token ids (integers of at least 0) to numbers in "
                                      f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {pair!r}")
        if self.guide is not None:
            check_guide(self.guide)
        if self.pooling not in (None, *POOLING):
            raise InvalidArgument(f"pooling must be one of {', '.join(POOLING)}, got {self.pooling!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def filters(self) -> bool:
        """Whether any of top-k, top-p and min-p removes tokens."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    @property
    def penalized(self) -> bool:
        """Whether any of the repetition, presence and frequency penalties is on."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


def check_guide(guide: tuple[str, str]) -> None:
    """A guide's shape (its grammar is checked when the engine compiles it)."""
    if (not isinstance(guide, tuple) or len(guide) != 2 or guide[0] not in GUIDE_KINDS
            or not isinstance(guide[1], str)):
        raise InvalidArgument(f"a guide is (kind, spec) with kind one of {', '.join(GUIDE_KINDS)}, got {guide!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


GREEDY = SamplingParams(temperature=0.0)
