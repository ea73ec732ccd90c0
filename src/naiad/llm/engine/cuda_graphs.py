"""Decode steps replayed from CUDA graphs.

A decode step of a small model on a fast GPU is bound by the host launching ~300 kernels one
by one (an H200 took ~9-12 ms per step of the 123M Llama at 1 to 256 rows, eager). Captured
once per batch size, the whole forward is replayed with one launch.

A graph fixes its tensors' addresses and shapes, so each captured size works on static
buffers: the step's rows are copied in, the batch is padded up to the next captured size, and
the padded rows write their K/V into a spare block that the block manager never hands out
(the runner allocates it past `num_blocks`) and attend to that block alone. Attention in the
graph is the Triton decode kernel, whose loop bounds are read from the device, so one graph
serves every context length up to `max_blocks` blocks. Prefill and mixed steps run eagerly.
"""

from __future__ import annotations

import torch

from naiad.llm.layers.attention import AttentionMetadata, KVCache
from naiad.llm.models.llama import LlamaForCausalLM

#: Batch sizes captured (up to the engine's max_num_seqs); a step pads up to the next one.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class DecodeGraphs:
    """One captured decode forward per batch size; `run` replays the smallest that fits."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[KVCache],
        max_rows: int,
        max_blocks: int,
        block_size: int,
        spare_block: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.spare_block = spare_block
        self.max_blocks = max_blocks
        self.sizes = [size for size in BUCKETS if size < max_rows] + [max_rows]
        rows = self.sizes[-1]
        long = torch.long
        self.token_ids = torch.zeros(rows, dtype=long, device=device)
        self.positions = torch.zeros(rows, dtype=long, device=device)
        self.slot_mapping = torch.full((rows,), spare_block * block_size, dtype=long, device=device)
        self.block_tables = torch.full((rows, max_blocks), spare_block, dtype=long, device=device)
        self.context_lens = torch.ones(rows, dtype=long, device=device)
        self.row_index = torch.arange(rows, dtype=long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture()

    def _forward(self, rows: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:rows],
            decode_tokens=self.row_index[:rows],
            decode_block_tables=self.block_tables[:rows],
            decode_context_lens=self.context_lens[:rows],
            prefills=[],
        )
        return self.model(self.token_ids[:rows], self.positions[:rows], meta, self.kv_caches, self.row_index[:rows])

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for rows in self.sizes:
                self._forward(rows)  # compiles the Triton kernels outside of any capture
        torch.cuda.current_stream().wait_stream(stream)
        for rows in reversed(self.sizes):  # the largest first, so the smaller ones reuse its pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[rows] = self._forward(rows)
            self.graphs[rows] = graph
        torch.cuda.synchronize()

    def fits(self, rows: int, widest_table: int) -> bool:
        return rows <= self.sizes[-1] and widest_table <= self.max_blocks

    def run(
        self, token_ids: list[int], positions: list[int], block_tables: list[list[int]], context_lens: list[int]
    ) -> torch.Tensor:
        """Logits `[rows, vocab]` of one decode step: row i feeds `token_ids[i]` at `positions[i]`."""
        rows = len(token_ids)
        size = next(size for size in self.sizes if size >= rows)
        pad = size - rows
        tables = [table + [self.spare_block] * (self.max_blocks - len(table)) for table in block_tables]
        tables += [[self.spare_block] * self.max_blocks] * pad
        slots = [
            table[p // self.block_size] * self.block_size + p % self.block_size
            for table, p in zip(block_tables, positions, strict=True)
        ]
        spare_slot = self.spare_block * self.block_size
        # One host-to-device copy per buffer; the padded rows read and write the spare block only.
        self.token_ids[:size].copy_(torch.tensor(token_ids + [0] * pad), non_blocking=True)
        self.positions[:size].copy_(torch.tensor(positions + [0] * pad), non_blocking=True)
        self.slot_mapping[:size].copy_(torch.tensor(slots + [spare_slot] * pad), non_blocking=True)
        self.context_lens[:size].copy_(torch.tensor(context_lens + [1] * pad), non_blocking=True)
        self.block_tables[:size].copy_(torch.tensor(tables), non_blocking=True)
        self.graphs[size].replay()
        return self.logits[size][:rows]
