"""The in-process LLM engine: `step() = schedule → execute → update`.

It runs on the caller's thread; the engine-core process with its busy loop, the serving
backend and the tokenizer wrap it later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from naiad.errors import InvalidArgument
from naiad.llm.distributed.nodes import Cluster
from naiad.llm.distributed.parallel import check_devices, check_no_group, check_shardable, check_stages, destroy_group
from naiad.llm.distributed.workers import WorkerGroup
from naiad.llm.engine.block_manager import BlockManager
from naiad.llm.engine.guided import Grammars
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.engine.scheduler import SchedulerConfig, StepScheduler
from naiad.llm.engine.sequence import Sequence
from naiad.llm.loading.loader import read_args, read_eos_token_ids

if TYPE_CHECKING:
    from naiad.llm.distributed.ray_workers import RayWorkerGroup


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine is built from.

    `kv_cache_memory` is the KV cache's size in bytes; without it the cache takes
    `kv_cache_fraction` of the memory free once the model is loaded (on a GPU, its free memory,
    0.9 by default; on the CPU, the host's available memory, 0.1 by default). `max_model_len` None is the model's
    context length, capped by what the KV cache holds.

    `tensor_parallel_size` N > 1 splits the model over N processes (this one and N - 1 workers,
    `naiad.llm.distributed.workers`); the KV cache memory is then per rank, each holding its kv heads.
    `pipeline_parallel_size` P > 1 splits the decoder layers into P stages, each a process (or a
    tensor-parallel group of them: N x P processes in all, `naiad.llm.distributed.pipeline`); each stage's KV
    cache holds its layers. `pipeline_micro_batches` caps the micro-batches a step is cut into
    (None: P; 1 turns micro-batching off).
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
    quantization: str = "none"  # "int8", "gguf" or "auto" (naiad.llm.layers.quantization, loader.resolve_quantization)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_micro_batches: int | None = None
    #: "mp": ranks are processes this engine starts (on other nodes: `naiad llm-node` agents);
    #: "ray": Ray actors in a placement group (naiad.llm.distributed.ray_workers; needs the `ray` extra)
    distributed_executor_backend: str = "mp"
    #: Multi-node ("mp"): the ranks split evenly over `nnodes` machines meeting at rank 0's
    #: `master_addr`:`master_port` (naiad.llm.distributed.nodes); every node shares $NAIAD_CLUSTER_KEY.
    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    def runner_config(self) -> RunnerConfig:
        # The runner's settings are a subset of the engine's, by the same names.
        return RunnerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunnerConfig)})


class LLMEngine:
    """Continuous batching over one model: requests join and leave the batch between steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.workers: WorkerGroup | RayWorkerGroup | None = None
        parallel = config.tensor_parallel_size * config.pipeline_parallel_size
        if config.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {config.tensor_parallel_size}")
        if config.pipeline_parallel_size != 1:  # before starting any process
            check_stages(read_args(config.model).num_layers, config.pipeline_parallel_size)
        if config.pipeline_micro_batches is not None and config.pipeline_micro_batches < 1:
            raise ValueError(f"pipeline_micro_batches must be at least 1, got {config.pipeline_micro_batches}")
        if config.distributed_executor_backend not in ("mp", "ray"):
            raise ValueError(f"distributed_executor_backend must be mp or ray, got "
                             f"{config.distributed_executor_backend!r}")
        cluster = Cluster(config.nnodes, config.master_addr, config.master_port)
        cluster.check(parallel)
        if cluster.active and config.distributed_executor_backend == "ray":
            raise ValueError("nnodes applies to the mp backend; Ray places the ranks on its own nodes")
        self.runner = self._start_runner() if parallel > 1 else ModelRunner(config.runner_config())
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.max_model_len = self._max_model_len()
        self.scheduler = StepScheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len), self.block_manager
        )
        self.eos_token_ids = read_eos_token_ids(config.model)
        self.grammars = Grammars(config.model, self.runner.args.vocab_size, self.eos_token_ids)
        self._request_ids = itertools.count()

    def _start_runner(self) -> ModelRunner:
        """Rank 0's runner, with the workers started and in the group; all stopped if one fails."""
        tp, pp = self.config.tensor_parallel_size, self.config.pipeline_parallel_size
        config = self.config
        check_shardable(read_args(config.model), tp)  # before starting any process
        cluster = Cluster(config.nnodes, config.master_addr, config.master_port)
        if config.distributed_executor_backend == "ray":
            pass  # the GPUs may be on other nodes: Ray's placement group checks them
        elif pp == 1 and not cluster.active:
            check_devices(config.device, tp)
        else:
            check_devices(config.device, cluster.ranks_per_node(tp * pp), "the ranks on this node:")
        check_no_group()  # another engine's group: failing later would tear it down
        workers: WorkerGroup | RayWorkerGroup
        if config.distributed_executor_backend == "ray":
            from naiad.llm.distributed.ray_workers import RayWorkerGroup  # Ray only when asked for

            workers = RayWorkerGroup(config.runner_config(), tp, pp)
        else:
            workers = WorkerGroup(config.runner_config(), tp, pp, cluster)
        self.workers = workers
        try:
            runner = ModelRunner(self.config.runner_config(), workers.join(self.config.device),
                                 workers.send_step)
            workers.wait_ready()
        except Exception as error:
            # A worker that failed to load makes rank 0's first collective fail: its own error says why.
            reason = workers.start_failure()
            self.close()
            if reason is not None:
                raise RuntimeError(reason) from error
            raise
        return runner

    def close(self) -> None:
        """Stop the parallel workers and leave the process group (nothing to do on one process)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None
            with contextlib.suppress(Exception):  # a group with a dead rank may not tear down cleanly
                destroy_group()

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
        pooling = sampling_params is not None and sampling_params.pooling is not None
        if pooling and self.config.pipeline_parallel_size > 1:
            raise InvalidArgument("embeddings (pooling) are not served under pipeline parallelism")
        if sampling_params is not None and sampling_params.guide is not None:
            seq.grammar = self.grammars.state(sampling_params.guide)
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
        try:
            sampled, logprobs = self.runner.execute(output)
        except Exception:
            if self.workers is not None:
                self.workers.check(wait=1.0)  # a dead worker is why: raise WorkerDied, which says so
            raise
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
