"""What `quantization: "int8"` learns of a model's inputs before quantizing it: each linear
layer's input columns' root mean square over one calibration forward.

Most LLMs carry a few channels 10-50x larger than the rest in their residual stream (SmolLM2-135M:
3-6 of 576 in every layer's norm outputs, and some MLP channels reach thousands on the first
token). Those channels are the same whatever the text, so a short forward finds them; the int8
layers then keep those columns' weights in float16 (quantization.Int8Linear, the columns from
`outlier_columns`), where rounding them would be multiplied by the largest inputs.

The calibration input is fixed: `CALIBRATION_TOKENS` token ids drawn with a fixed seed (no
tokenizer needed; on SmolLM2 random ids find the same columns as English text within 0.05e-3 of
KL divergence from fp32), so the same model quantizes the same way every time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from naiad.llm.layers.quantization import OUTLIER_COLUMNS

if TYPE_CHECKING:
    from naiad.llm.distributed.parallel import TensorParallel

#: Tokens of the calibration forward: enough to see the outlier channels, cheap next to loading.
CALIBRATION_TOKENS = 64


def calibration_tokens(vocab_size: int, count: int = CALIBRATION_TOKENS) -> list[int]:
    """`count` token ids below `vocab_size`, the same every time."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (count,), generator=generator).tolist()


def input_rms(model: nn.Module, run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Each `nn.Linear` of `model` (by module name) → the root mean square of its input's columns
    over every call `run()` makes to it (float32, on the CPU). Layers `run` does not reach are left out."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + x.pow(2).sum(dim=0).cpu()
            counts[name] = counts.get(name, 0) + x.shape[0]

        return hook

    handles = [module.register_forward_hook(record(name)) for name, module in model.named_modules()
               if isinstance(module, nn.Linear)]
    try:
        with torch.inference_mode():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return {name: (total / counts[name]).sqrt().float() for name, total in sums.items()}


def outlier_columns(
    rms: Mapping[str, torch.Tensor],
    tp: TensorParallel,
    row_parallel: Callable[[str], bool],
    device: torch.device,
    count: int = OUTLIER_COLUMNS,
) -> dict[str, torch.Tensor]:
    """Each layer of `rms` (`input_rms`'s answer) → the `count` input columns of the largest
    root mean square, sorted (int64): those its int8 form keeps in float16.

    Under tensor parallelism a layer for which `row_parallel(name)` holds rank r's r-th equal share
    of the input columns: its columns are chosen among every rank's (the ranks exchange their
    rms on `device`, one collective for all such layers), so that the split model keeps the same
    columns as one process, each rank those in its share (as indices into its share)."""
    chosen = {name: _top(values, count) for name, values in rms.items()}
    split = [name for name in rms if tp.active and row_parallel(name)]
    if not split:
        return chosen
    everyone = tp.all_gather(torch.cat([rms[name] for name in split]).to(device)).cpu().view(tp.size, -1)
    offset = 0
    for name in split:
        share = rms[name].numel()
        columns = _top(everyone[:, offset : offset + share].reshape(-1), count)
        mine = columns[(columns >= tp.rank * share) & (columns < (tp.rank + 1) * share)]
        chosen[name] = mine - tp.rank * share
        offset += share
    return chosen


def _top(values: torch.Tensor, count: int) -> torch.Tensor:
    return values.float().topk(min(count, values.numel())).indices.sort().values
