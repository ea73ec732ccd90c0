"""The bf16 linear kernel (kernels/bf16_linear.c) against torch's bf16 linear: the same outputs
up to the order of the sums, on any row count, width and thread count."""

from __future__ import annotations

import pytest
import torch

from naiad.llm import kernels

needs_bf16 = pytest.mark.skipif(not kernels.has_bf16_linear(), reason="this CPU or build lacks AVX-512")


def _case(rows: int, out_features: int, in_features: int, bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    b = torch.randn(out_features, generator=generator).bfloat16() if bias else None
    return x, weight, b


def _worst(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[float, float]:
    """(the kernel's, torch's) largest distance to the float32 result, in units of the float32 result's largest
    magnitude: both round the same float32 sums to bf16 once."""
    exact = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    torch_bf16 = torch.nn.functional.linear(x, weight, bias).float()
    scale = exact.abs().max().clamp_min(1e-6)
    return float((got.float() - exact).abs().max() / scale), float((torch_bf16 - exact).abs().max() / scale)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 64])
@pytest.mark.parametrize(("out_features", "in_features"), [(200, 96), (33, 77), (16, 2), (2304, 768)])
@pytest.mark.parametrize("bias", [False, True])
def test_it_rounds_the_float32_result_as_torch_does(rows: int, out_features: int, in_features: int,
                                                    bias: bool) -> None:
    x, weight, b = _case(rows, out_features, in_features, bias)
    got = kernels.bf16_linear(x, kernels.bf16_panels(weight), b, out_features)
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    ours, theirs = _worst(got, x, weight, b)
    assert ours <= max(theirs, 2**-8), (ours, theirs)  # within bf16's own rounding of the float32 result


@needs_bf16
@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("rows", [1, 6])
def test_the_thread_count_changes_no_bit(threads: int, rows: int) -> None:
    x, weight, b = _case(rows, 1000, 160, True)
    panels = kernels.bf16_panels(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.bf16_linear(x, panels, b, 1000)
        torch.set_num_threads(threads)
        many = kernels.bf16_linear(x, panels, b, 1000)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


@needs_bf16
def test_leading_dimensions_are_kept_and_no_rows_is_fine() -> None:
    x, weight, _ = _case(6, 40, 24, False)
    panels = kernels.bf16_panels(weight)
    flat = kernels.bf16_linear(x, panels, None, 40)
    assert torch.equal(kernels.bf16_linear(x.view(2, 3, 24), panels, None, 40), flat.view(2, 3, 40))
    assert kernels.bf16_linear(x[:0], panels, None, 40).shape == (0, 40)


def _panel(packed: torch.Tensor, panel: int) -> torch.Tensor:
    """Panel `panel` of `bf16_panels`' result, `[in_pad / 2, 16, 2]`, read from its group: for each
    pair of inputs, the 16 outputs' two weights."""
    panels, pairs = packed.shape[:2]
    first = panel - panel % kernels.BF16_GROUP
    size = min(kernels.BF16_GROUP, panels - first)
    group = packed.flatten()[first * pairs * kernels.BF16_PANEL * 2:(first + size) * pairs * kernels.BF16_PANEL * 2]
    return group.view(pairs, size, kernels.BF16_PANEL, 2)[:, panel - first]


def test_the_panel_layout_holds_each_pair_of_inputs_for_sixteen_outputs() -> None:
    weight = torch.arange(20 * 5, dtype=torch.float32).view(20, 5).bfloat16()
    panels = kernels.bf16_panels(weight)
    assert panels.shape == (2, 3, 16, 2)  # 20 outputs in 2 panels, 5 inputs padded to 3 pairs
    assert torch.equal(_panel(panels, 0)[1, 4], weight[4, 2:4])  # panel 0, inputs 2-3, output 4
    last = _panel(panels, 1)
    assert torch.equal(last[2, 3], torch.stack([weight[19, 4], torch.tensor(0.0).bfloat16()]))  # padding is 0
    assert not last[:, 4:].any()  # outputs past 20


def test_groups_of_four_panels_lie_interleaved_pair_by_pair() -> None:
    weight = torch.randn(16 * 6, 8).bfloat16()  # six panels: a group of four, then one of two
    memory = kernels.bf16_panels(weight).flatten()
    pairs, pair = 4, 16 * 2
    first_group = memory[:4 * pairs * pair].view(pairs, 4, 16, 2)
    second_group = memory[4 * pairs * pair:].view(pairs, 2, 16, 2)
    for k in range(pairs):
        for j in range(4):
            assert torch.equal(first_group[k, j], weight[16 * j:16 * (j + 1), 2 * k:2 * k + 2])
        for j in range(2):
            assert torch.equal(second_group[k, j], weight[16 * (4 + j):16 * (5 + j), 2 * k:2 * k + 2])
    for panel in range(6):
        assert torch.equal(_panel(kernels.bf16_panels(weight), panel),
                           weight[16 * panel:16 * (panel + 1)].view(16, 4, 2).transpose(0, 1))


@needs_bf16
@pytest.mark.parametrize("out_features", [64, 80, 96, 112, 33, 200])  # last group of 4, 1, 2, 3 panels
def test_a_row_comes_out_the_same_alone_or_among_others(out_features: int) -> None:
    """One row runs against a group's four panels alone, several rows four at a time: each output's
    sum is the same chain either way, so each row's bits are the same."""
    x, weight, b = _case(7, out_features, 50, True)
    panels = kernels.bf16_panels(weight)
    together = kernels.bf16_linear(x, panels, b, out_features)
    for row in range(7):
        assert torch.equal(kernels.bf16_linear(x[row:row + 1], panels, b, out_features)[0], together[row])


@needs_bf16
def test_one_pair_of_inputs_is_one_rounding_and_a_nan_stays_a_nan() -> None:
    """With two inputs the float32 sum is exact but for one rounding (each product of two bf16 is
    exact in float32), so every output must be torch's float32 result rounded to bf16, bit for bit:
    the pair's two products summed (AVX512-BF16's instruction, or the two FMAs that stand in for it
    without that extension) and the result rounded to nearest even. A NaN input gives a NaN."""
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 2, generator=generator) * 100).bfloat16()
    weight = torch.randn(40, 2, generator=generator).bfloat16()
    x[4, 1] = float("nan")
    weight[0] = 1.0
    x[0], x[1] = torch.tensor([1.0, 2**-8]), torch.tensor([1 + 2**-7, 2**-8])  # ties: to even, down then up
    got = kernels.bf16_linear(x, kernels.bf16_panels(weight), None, 40)
    want = torch.nn.functional.linear(x.float(), weight.float()).bfloat16()
    assert got[0, 0] == 1.0 and got[1, 0] == 1 + 2**-6
    assert got[4].isnan().all()
    assert torch.equal(torch.cat([got[:4], got[5:]]), torch.cat([want[:4], want[5:]]))


@needs_bf16
def test_wrong_inputs_are_refused() -> None:
    x, weight, _ = _case(2, 32, 16, False)
    panels = kernels.bf16_panels(weight)
    with pytest.raises(ValueError, match="bf16 x"):
        kernels.bf16_linear(x.float(), panels, None, 32)
    with pytest.raises(ValueError, match="panels of 18 inputs"):
        kernels.bf16_linear(torch.zeros(2, 18, dtype=torch.bfloat16), panels, None, 32)
    with pytest.raises(ValueError, match="bias"):
        kernels.bf16_linear(x, panels, torch.zeros(31, dtype=torch.bfloat16), 32)


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_LLM_BF16_KERNEL", "0")
    assert not kernels.has_bf16_linear()
