"""The runner's KV budget: explicit bytes, or a fraction of the memory free after loading."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
import torch
from frontends.hostile import rss

from naiad.llm.engine import model_runner
from naiad.llm.engine.block_manager import num_blocks_for
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.model_runner import RunnerConfig, available_host_memory, kv_cache_budget

CPU = torch.device("cpu")


def test_explicit_bytes_win() -> None:
    assert kv_cache_budget(RunnerConfig("m", kv_cache_memory=12345, kv_cache_fraction=0.5), CPU) == 12345


def test_a_fraction_of_the_available_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_runner, "available_host_memory", lambda: 10_000_000)
    assert kv_cache_budget(RunnerConfig("m", kv_cache_fraction=0.25), CPU) == 2_500_000
    assert kv_cache_budget(RunnerConfig("m"), CPU) == 1_000_000  # the CPU's default share is 0.1


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        kv_cache_budget(RunnerConfig("m", kv_cache_fraction=fraction), CPU)


def test_available_memory_is_read_from_the_host() -> None:
    available = available_host_memory()
    assert 0 < available <= 1 << 50


def test_an_engine_sizes_its_cache_from_the_fraction(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_runner, "available_host_memory", lambda: 64 << 20)
    engine = LLMEngine(EngineConfig(model=tiny_models["llama"], dtype="float32", block_size=4, kv_cache_fraction=0.5))
    # the tiny model: 2 layers, 2 KV heads of 16 dims, float32
    assert engine.runner.num_blocks == num_blocks_for(32 << 20, 4, 2, 2, 16, 4)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="not glibc")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    # 1,600 blocks of 64 KiB: under glibc's mmap threshold, so they come from the heap, and the
    # last one keeps the heap's top in place when the rest are freed.
    blocks = [bytearray(64 << 10) for _ in range(1_600)]
    keep = bytearray(64 << 10)
    del blocks
    before = rss(os.getpid())
    model_runner.release_freed_heap()
    assert before - rss(os.getpid()) > 50 << 20  # most of the 100 MiB freed
    assert len(keep) == 64 << 10
