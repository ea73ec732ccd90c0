"""The LLM's weights and KV cache on memory advised for transparent huge pages."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from llm.tiny_models import build_tiny_model, hf_greedy, hf_model, tokens
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.layers import huge_pages
from naiad.llm.layers.attention import allocate_kv_caches

needs_thp = pytest.mark.skipif(not huge_pages.supported(), reason="no transparent huge pages on this kernel")


def advised(address: int) -> bool:
    """Whether the mapping holding `address` is advised for huge pages (`hg` in its VmFlags)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return "hg" in line.split()[1:]
    return False


class Block(nn.Module):
    def __init__(self, shared: nn.Parameter) -> None:
        super().__init__()
        self.weight = shared  # the same Parameter object as the owner's: a tie
        storage = torch.arange(300_000, dtype=torch.float32)
        self.register_buffer("first", storage[:100_000])  # two views of one storage
        self.register_buffer("second", storage[150_000:].view(1_500, 100))
        self.register_buffer("small", torch.ones(8))


class Owner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(1_024, 256))
        self.block = Block(self.embedding)


@needs_thp
def test_place_moves_large_tensors_to_advised_memory_keeping_values_ties_and_views() -> None:
    module = Owner()
    before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    small = module.block.small.data_ptr()

    moved = huge_pages.place(module)

    assert moved >= 1_024 * 256 * 4 + 300_000 * 4
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert module.block.weight is module.embedding  # the tie holds
    assert isinstance(module.embedding, nn.Parameter) and module.embedding.requires_grad
    module.block.first[0] = -1.0  # the two views still share their storage
    module.block.second.view(-1)[0] = -2.0
    assert module.block.first.untyped_storage().data_ptr() == module.block.second.untyped_storage().data_ptr()
    assert module.block.second.data_ptr() - module.block.first.data_ptr() == 150_000 * 4
    assert advised(module.embedding.data_ptr()) and advised(module.block.first.data_ptr())
    assert module.block.small.data_ptr() == small  # under min_bytes: left where it was


def test_nothing_moves_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_LLM_HUGE_PAGES", "0")
    module = Owner()
    address = module.embedding.data_ptr()
    assert huge_pages.place(module) == 0
    assert module.embedding.data_ptr() == address
    assert [t.sum().item() for t in huge_pages.zeros([(2, 3)], torch.float32)] == [0.0]


@needs_thp
def test_kv_caches_on_the_cpu_are_zeroed_disjoint_and_advised() -> None:
    caches = allocate_kv_caches(3, 10, 4, 2, 16, torch.bfloat16, "cpu")
    tensors = [tensor for pair in caches for tensor in pair]
    assert all(t.shape == (10, 4, 2, 16) and t.dtype == torch.bfloat16 for t in tensors)
    assert all(t.abs().sum().item() == 0 for t in tensors)
    starts = sorted(t.data_ptr() for t in tensors)
    size = 10 * 4 * 2 * 16 * 2
    assert all(b - a >= size for a, b in itertools.pairwise(starts))  # no two overlap
    tensors[0].fill_(1.0)
    assert all(t.abs().sum().item() == 0 for t in tensors[1:])
    assert all(advised(t.data_ptr()) for t in tensors)


@needs_thp
def test_an_engine_decodes_from_weights_on_huge_pages_as_transformers_does(tmp_path: Path) -> None:
    # A vocabulary large enough that the (tied) embedding passes place()'s 64 KiB floor.
    path = build_tiny_model("llama", tmp_path / "llama", vocab_size=1_024)
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", block_size=4, kv_cache_memory=1 << 20))
    embedding = engine.runner.model.model.embed_tokens.weight
    assert advised(embedding.data_ptr()) and advised(engine.runner.kv_caches[0][0].data_ptr())
    prompt = tokens(9, 3)
    engine.add_request(prompt, 8, sampling_params=GREEDY)
    finished = []
    for _ in range(50):
        finished += engine.step()
        if finished:
            break
    assert [seq.output_token_ids for seq in finished] == [hf_greedy(hf_model(path), prompt, 8)]
