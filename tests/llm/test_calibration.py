"""The calibration forward of `quantization: "int8"`: fixed tokens, each linear layer's input
columns' root mean square, the columns chosen from it (among every rank's for a row-parallel
layer), and the engine's runner using them so that every int8 layer keeps the columns of its
largest inputs in float16. The split model's choice against one process's is in
test_tensor_parallel.py (two real ranks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from naiad.llm.distributed.parallel import TensorParallel
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig
from naiad.llm.layers.calibration import CALIBRATION_TOKENS, calibration_tokens, input_rms, outlier_columns
from naiad.llm.layers.quantization import OUTLIER_COLUMNS, Int8Linear


def test_the_calibration_tokens_are_fixed_and_in_the_vocabulary() -> None:
    tokens = calibration_tokens(1000)
    assert len(tokens) == CALIBRATION_TOKENS and tokens == calibration_tokens(1000)
    assert all(0 <= t < 1000 for t in tokens) and len(set(tokens)) > CALIBRATION_TOKENS // 2
    torch.manual_seed(123)  # the global generator plays no part
    assert calibration_tokens(1000) == tokens


def test_input_rms_is_each_linears_input_column_rms_over_every_call() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    first, second = torch.randn(5, 4), torch.randn(2, 3, 4)  # two calls, one of them batched twice over

    def run() -> None:
        model(first)
        model(second)

    rms = input_rms(model, run)
    assert set(rms) == {"0", "2"}
    inputs = torch.cat([first, second.reshape(-1, 4)])
    torch.testing.assert_close(rms["0"], inputs.pow(2).mean(dim=0).sqrt())
    hidden = model[1](model[0](inputs))
    torch.testing.assert_close(rms["2"], hidden.pow(2).mean(dim=0).sqrt())
    assert not model[0]._forward_hooks  # the hooks are gone
    assert input_rms(model, lambda: None) == {}  # a layer the forward does not reach is left out


def test_outlier_columns_are_each_layers_largest_rms_sorted() -> None:
    rms = {"a": torch.tensor([0.1, 9.0, 0.2, 8.0, 0.3]), "b": torch.tensor([5.0, 1.0])}
    columns = outlier_columns(rms, TensorParallel.single(), lambda name: True, torch.device("cpu"), count=2)
    assert {name: c.tolist() for name, c in columns.items()} == {"a": [1, 3], "b": [0, 1]}
    assert columns["a"].dtype == torch.int64


@dataclass(frozen=True)
class ExchangingRank(TensorParallel):
    """Rank `rank` of a group whose other ranks' answers are known beforehand (`others`: each rank's
    tensor for `all_gather`, this rank's place left out)."""

    others: tuple[torch.Tensor, ...] = ()

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.others)
        parts.insert(self.rank, x)
        return torch.cat(parts)


def test_a_row_parallel_layer_chooses_among_every_ranks_columns() -> None:
    # the full layer has 12 inputs, 4 per rank; its two largest are 5 (rank 1's 1) and 10 (rank 2's 2)
    full = torch.tensor([1.0, 2, 1, 1, 3, 90, 1, 1, 1, 2, 80, 1])
    column = torch.tensor([5.0, 1, 1, 7])  # a column-parallel layer: the same whole inputs on every rank
    shares = full.view(3, 4)
    for rank in range(3):
        others = tuple(shares[r] for r in range(3) if r != rank)
        tp = ExchangingRank(rank, 3, others=others)
        chosen = outlier_columns({"row": shares[rank], "column": column}, tp, lambda name: name == "row",
                                 torch.device("cpu"), count=2)
        assert chosen["column"].tolist() == [0, 3]
        assert chosen["row"].tolist() == {0: [], 1: [1], 2: [2]}[rank]  # indices into the rank's share


def test_the_runner_calibrates_int8_at_load(tiny_models: dict[str, Path]) -> None:
    config = RunnerConfig(model=tiny_models["qwen2"], dtype="float32", kv_cache_memory=1 << 20, quantization="int8")
    runner = ModelRunner(config)
    layers = {name: m for name, m in runner.model.named_modules() if isinstance(m, Int8Linear)}
    assert len(layers) == 2 * 4 + 1  # qkv, o, gate_up, down per layer; the (untied) LM head
    assert runner.kv_caches and runner.num_blocks > 0  # the calibration's own cache is gone
    # the columns are those of the largest inputs in fp32's calibration forward
    fp32 = ModelRunner(RunnerConfig(model=tiny_models["qwen2"], dtype="float32", kv_cache_memory=1 << 20))
    rms = fp32._calibrate()
    assert set(rms) == set(layers)
    for name, layer in layers.items():
        assert layer.columns.numel() == OUTLIER_COLUMNS
        assert layer.columns.tolist() == sorted(rms[name].topk(OUTLIER_COLUMNS).indices.tolist()), name
