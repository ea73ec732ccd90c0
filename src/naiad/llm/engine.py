"""The in-process LLM engine: `step() = schedule → execute → update`.

It runs on the caller's thread; the engine-core process with its busy loop, the serving
backend and the tokenizer wrap it later.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

from naiad.errors import InvalidArgument
from naiad.llm.block_manager import BlockManager
from naiad.llm.loader import read_eos_token_ids
from naiad.llm.model_runner import ModelRunner, RunnerConfig
from naiad.llm.sampling_params import SamplingParams
from naiad.llm.scheduler import Scheduler, SchedulerConfig
from naiad.llm.sequence import Sequence


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine is built from.

    `kv_cache_memory` is the KV cache's size in bytes; without it the cache takes
    `kv_cache_fraction` of the memory free once the model is loaded (on a GPU, its free memory,
    0.9 by default; on the CPU, the host's available memory, 0.1 by default). `max_model_len` None is the model's
    context length, capped by what the KV cache holds.
    """

    model: str | Path
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_fraction: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # on CUDA: no CUDA graphs for decode steps
    quantization: str = "none"  # "int8": weight-only INT8 linears (naiad.llm.quantization)

    def runner_config(self) -> RunnerConfig:
        # The runner's settings are a subset of the engine's, by the same names.
        return RunnerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunnerConfig)})


class LLMEngine:
    """Continuous batching over one model: requests join and leave the batch between steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner = ModelRunner(config.runner_config())
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.max_model_len = self._max_model_len()
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len), self.block_manager
        )
        self.eos_token_ids = read_eos_token_ids(config.model)
        self._request_ids = itertools.count()

    def _max_model_len(self) -> int:
        model_len = self.runner.args.max_model_len
        if self.config.max_model_len is None:
            return min(model_len, self.runner.num_blocks * self.config.block_size)
        if self.config.max_model_len > model_len:
            raise ValueError(f"max_model_len {self.config.max_model_len} exceeds the model's context ({model_len})")
        return self.config.max_model_len

    def add_request(
        self,
        prompt_token_ids: list[int],
        max_tokens: int = 16,
        *,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        ignore_eos: bool = False,
        priority: int = 0,
    ) -> str:
        """Queue a request; it joins the batch at the next step. Returns its id.

        `sampling_params` None samples at temperature 1 with no filters, as OpenAI's default.
        """
        if request_id is None:
            request_id = f"req-{next(self._request_ids)}"
        self._check_tokens(prompt_token_ids)
        if sampling_params is not None and sampling_params.stop_token_ids:
            self._check_tokens(list(sampling_params.stop_token_ids))
        seq = Sequence(
            request_id,
            prompt_token_ids,
            max_tokens,
            eos_token_ids=self.eos_token_ids,
            ignore_eos=ignore_eos,
            priority=priority,
            sampling_params=sampling_params,
        )
        self.scheduler.add(seq)
        return request_id

    def _check_tokens(self, token_ids: list[int]) -> None:
        vocab = self.runner.args.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is; False if it is not (or no longer) here."""
        return self.scheduler.abort(request_id) is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Sequence]:
        """Run one model step; return the sequences that finished in it."""
        output = self.scheduler.schedule()
        sampled, logprobs = self.runner.execute(output)
        return self.scheduler.update(output, sampled, logprobs)

    def generate(
        self, prompts: list[list[int]], max_tokens: int = 16, sampling_params: SamplingParams | None = None
    ) -> list[list[int]]:
        """Run the prompts together to the end; their generated tokens, in prompt order."""
        ids = [self.add_request(prompt, max_tokens, sampling_params=sampling_params) for prompt in prompts]
        outputs: dict[str, list[int]] = {}
        while self.has_unfinished():
            outputs.update((seq.seq_id, seq.output_token_ids) for seq in self.step())
        return [outputs[request_id] for request_id in ids]
