"""The LLM engine on an NVIDIA GPU: the same continuous batch as on the CPU, checked against
transformers running on the same GPU. Skipped unless torch sees CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm.tiny_models import PREFIX, REQUESTS, TINY, build_tiny_model, hf_model, run_staggered

from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

BLOCK = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cuda-models")
    return {variant: build_tiny_model(variant, root / variant) for variant in ("llama", "qwen2")}


def _hf_greedy_cuda(path: Path, dtype: torch.dtype) -> list[list[int]]:
    model = hf_model(path).to("cuda", dtype)
    outputs = []
    for prompt, max_tokens, _ in REQUESTS:
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=0)
        outputs.append(out[0, len(prompt):].tolist())
    return outputs


def _engine(path: Path, dtype: str = "float32", **overrides: object) -> LLMEngine:
    config = {"model": path, "dtype": dtype, "device": "cuda", "block_size": BLOCK, "kv_cache_memory": 8 << 20,
              "max_num_batched_tokens": 32, "max_model_len": 96}
    return LLMEngine(EngineConfig(**{**config, **overrides}))  # type: ignore[arg-type]


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-cache"])
@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_greedy_matches_transformers_on_cuda(models: dict[str, Path], variant: str, caching: bool) -> None:
    engine = _engine(models[variant], enable_prefix_caching=caching)
    assert engine.runner.kv_caches[0][0].device.type == "cuda"
    assert run_staggered(engine) == _hf_greedy_cuda(models[variant], torch.float32)
    assert (engine.block_manager.prefix_cache_hits > 0) == caching


def test_preemption_on_cuda_recomputes_the_same_tokens(models: dict[str, Path]) -> None:
    per_block = 2 * TINY["num_hidden_layers"] * BLOCK * TINY["num_key_value_heads"] * 16 * 4  # head_dim 16, fp32
    engine = _engine(models["llama"], kv_cache_memory=16 * per_block, max_model_len=64)
    assert engine.runner.num_blocks == 16
    assert run_staggered(engine) == _hf_greedy_cuda(models["llama"], torch.float32)
    assert engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_close_to_transformers_on_cuda(models: dict[str, Path], dtype: torch.dtype) -> None:
    engine = _engine(models["qwen2"], dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype])
    prompt = REQUESTS[2][0]
    model = engine.runner.model
    reference = hf_model(models["qwen2"]).to("cuda", dtype)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt], device="cuda")).logits[0, -1].float()
    engine.add_request(prompt, 1, sampling_params=GREEDY)
    captured: list[torch.Tensor] = []
    original = model.forward

    def capture(*args: object, **kwargs: object) -> torch.Tensor:
        logits = original(*args, **kwargs)
        captured.append(logits.detach().float())
        return logits

    model.forward = capture  # type: ignore[method-assign]
    while engine.has_unfinished():
        engine.step()
    assert captured[-1].shape == (1, TINY["vocab_size"])
    torch.testing.assert_close(captured[-1][0], expected, atol=0.1, rtol=0.05)


def test_seeded_sampling_on_cuda_is_reproducible_in_any_batch(models: dict[str, Path]) -> None:
    engine = _engine(models["llama"])
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    alone = engine.generate([PREFIX], max_tokens=10, sampling_params=seeded)[0]
    for prompt, _, _ in REQUESTS:
        engine.add_request(prompt, 8, sampling_params=SamplingParams(temperature=0.8))
    assert engine.generate([PREFIX], max_tokens=10, sampling_params=seeded)[0] == alone


def test_decode_steps_replay_cuda_graphs_with_the_same_tokens(models: dict[str, Path]) -> None:
    graphed = _engine(models["qwen2"], max_num_seqs=8)
    assert graphed.runner.graphs is not None and graphed.runner.graphs.sizes == [1, 2, 4, 8]
    replays = 0
    original = graphed.runner.graphs.run

    def counting_run(*args: object) -> torch.Tensor:
        nonlocal replays
        replays += 1
        return original(*args)  # type: ignore[arg-type]

    graphed.runner.graphs.run = counting_run  # type: ignore[method-assign]
    eager = _engine(models["qwen2"], enforce_eager=True)
    assert eager.runner.graphs is None
    # More requests than the largest graph at once: those steps run eagerly, the rest replay.
    prompts = [prompt for prompt, _, _ in REQUESTS] * 2
    expected = eager.generate(prompts, max_tokens=10, sampling_params=GREEDY)
    assert graphed.generate(prompts, max_tokens=10, sampling_params=GREEDY) == expected
    assert replays > 0
