"""Paged attention over block tables: the torch reference, for the CPU and for tests.

The KV cache of one layer is two tensors, keys and values, of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. Token `p` of a sequence has its K/V in
block `block_table[p // block_size]`, slot `p % block_size` (see `block_manager`); the flat
slot `block * block_size + offset` indexes the cache viewed as `[num_blocks * block_size, ...]`.

A step is a flattened batch: the new tokens of every scheduled sequence back to back. Row `s`
brings `query_lens[s]` new tokens, the last ones of its `context_lens[s]` tokens, so they sit
at positions `context_lens[s] - query_lens[s]`, ... `context_lens[s] - 1`. Attention first
writes the new K/V into the cache through `slot_mapping`, then lets each new token attend to
every token of its sequence up to and including itself, read back from the cache by block
table. That one rule covers a whole prompt, a prefill chunk after cached or earlier-computed
tokens, and a decode step.

Decode rows (one new token) are batched into one padded attention call; each prefill row runs
on its own, since padding a long chunk's queries across the batch would cost
`rows x chunk x context` scores. Decode rows go to a kernel that reads the cache through the
block tables directly: C on the CPU (`naiad.llm.kernels`), Triton on CUDA
(`kernels.triton_attention`); the torch reference below stays for prefill, for devices with
neither, and to check the kernels against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from naiad.llm import kernels
from naiad.llm.kernels import triton_attention
from naiad.llm.layers import huge_pages

#: One layer's cache: (keys, values), each [num_blocks, block_size, num_kv_heads, head_dim].
KVCache = tuple[torch.Tensor, torch.Tensor]


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[KVCache]:
    """The per-layer K/V tensors, zeroed.

    Zeroed rather than empty: padded decode rows read slots that no token wrote, and a NaN
    there would survive its zero attention weight (0 * NaN is NaN).
    """
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if torch.device(device).type == "cpu":  # on huge pages, as the weights: decode attention streams them
        tensors = huge_pages.zeros([shape] * (2 * num_layers), dtype)
        return [(tensors[2 * i], tensors[2 * i + 1]) for i in range(num_layers)]
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]


@dataclass(slots=True)
class PrefillRow:
    """A row with more than one new token: flattened tokens `[start, start + query_len)`."""

    start: int
    query_len: int
    context_len: int
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] blocks that hold its context


@dataclass(slots=True)
class AttentionMetadata:
    """Where one step's tokens go in the KV cache and what each of them attends to.

    `slot_mapping[t]` is the flat cache slot of flattened token `t`. Decode rows are gathered
    into `decode_tokens` (their indices in the flattened batch), `decode_block_tables`
    (`[rows, max_blocks]`, padded with block 0) and `decode_context_lens`; prefill rows are
    listed one by one.
    """

    slot_mapping: torch.Tensor
    decode_tokens: torch.Tensor
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    prefills: list[PrefillRow]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        """Metadata for rows in flattened order; `block_tables[s]` must cover `context_lens[s]`."""
        slots: list[int] = []
        decode_tokens: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillRow] = []
        start = 0
        for query_len, context_len, table in zip(query_lens, context_lens, block_tables, strict=True):
            used = table[: -(-context_len // block_size)]
            slots.extend(_slots(used, block_size, context_len - query_len, context_len))
            if query_len == 1:
                decode_tokens.append(start)
                decode_tables.append(used)
                decode_lens.append(context_len)
            else:
                block_ids = torch.tensor(used, dtype=torch.long, device=device)
                prefills.append(PrefillRow(start, query_len, context_len, block_ids))
            start += query_len
        width = max((len(table) for table in decode_tables), default=0)
        padded = [table + [0] * (width - len(table)) for table in decode_tables]
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            decode_tokens=torch.tensor(decode_tokens, dtype=torch.long, device=device),
            decode_block_tables=torch.tensor(padded, dtype=torch.long, device=device).view(len(padded), width),
            decode_context_lens=torch.tensor(decode_lens, dtype=torch.long, device=device),
            prefills=prefills,
        )


def _slots(block_table: list[int], block_size: int, begin: int, end: int) -> list[int]:
    """The flat cache slots of positions `[begin, end)` of a sequence."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(begin, end)]


def write_kv(k: torch.Tensor, v: torch.Tensor, cache: KVCache, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V (`[tokens, kv_heads, head_dim]`) at their slots."""
    k_cache, v_cache = cache
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens over their sequences' cached context.

    `q` is `[tokens, heads, head_dim]`, `k` and `v` are `[tokens, kv_heads, head_dim]` for the
    flattened batch; `heads` is a multiple of `kv_heads` (grouped-query attention). Returns
    `[tokens, heads, head_dim]`. With a `sliding_window` W (Mistral), the token at position p
    sees only positions p - W + 1 ... p.
    """
    write_kv(k, v, cache, meta.slot_mapping)
    if not meta.prefills:  # decode rows only: no scatter into a separate output
        return _decode(q, cache, meta, scale, sliding_window)
    out = torch.empty_like(q)
    if len(meta.decode_tokens):
        out[meta.decode_tokens] = _decode(q[meta.decode_tokens], cache, meta, scale, sliding_window)
    for row in meta.prefills:
        rows = slice(row.start, row.start + row.query_len)
        out[rows] = _prefill(q[rows], cache, row, scale, sliding_window)
    return out


def _decode(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """One query per row against its context."""
    if kernels.supports(q):
        return kernels.paged_decode_attention(
            q, *cache, meta.decode_block_tables, meta.decode_context_lens, scale, sliding_window
        )
    if triton_attention.supports(q, cache[0].shape[1]):
        return triton_attention.paged_decode_attention(
            q, *cache, meta.decode_block_tables, meta.decode_context_lens, scale, sliding_window
        )
    return decode_reference(q, cache, meta, scale, sliding_window)


def decode_reference(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float, sliding_window: int | None = None
) -> torch.Tensor:
    """The torch decode: all rows in one padded call over their gathered context."""
    keys, values = (_gather(c, meta.decode_block_tables) for c in cache)  # [rows, ctx, kv_heads, d]
    positions = torch.arange(keys.shape[1], device=q.device)
    lens = meta.decode_context_lens[:, None]
    mask = positions[None, :] < lens  # padding past each context
    if sliding_window is not None:
        mask &= positions[None, :] >= lens - sliding_window  # the query sits at position len - 1
    out = _sdpa(q[:, :, None], keys, values, mask[:, None, None, :], scale)  # [rows, heads, 1, d]
    return out[:, :, 0]


def _prefill(
    q: torch.Tensor, cache: KVCache, row: PrefillRow, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """A chunk of queries, the last ones of its context: each sees the context up to itself."""
    keys, values = (_gather(c, row.block_ids[None])[:, : row.context_len] for c in cache)
    queries = q.transpose(0, 1)[None]  # [1, heads, query_len, d]
    windowed = sliding_window is not None and row.context_len > sliding_window
    if row.query_len == row.context_len and not windowed:
        return _sdpa(queries, keys, values, None, scale)[0].transpose(0, 1)
    # Query i is at position past + i, past being the tokens before this chunk.
    past = row.context_len - row.query_len
    query_pos = torch.arange(row.query_len, device=q.device)[:, None] + past
    key_pos = torch.arange(row.context_len, device=q.device)[None, :]
    mask = key_pos <= query_pos
    if windowed:
        assert sliding_window is not None  # windowed says so
        mask &= key_pos > query_pos - sliding_window
    return _sdpa(queries, keys, values, mask[None, None], scale)[0].transpose(0, 1)


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """`[rows, blocks]` block ids → their tokens' entries, `[rows, blocks * block_size, kv_heads, d]`."""
    # index_select copies whole blocks; advanced indexing `cache[block_tables]` is several
    # times slower on the CPU, and much slower in bf16.
    rows, width = block_tables.shape
    blocks = cache.index_select(0, block_tables.reshape(-1))  # [rows * blocks, block_size, kv_heads, d]
    return blocks.view(rows, width * cache.shape[1], *cache.shape[2:])


def _sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """`q` `[rows, heads, queries, d]` over `keys`/`values` `[rows, ctx, kv_heads, d]`.

    A boolean `mask` (True = attend) broadcasts to `[rows, heads, queries, ctx]`; None means
    causal with as many queries as keys.
    """
    k, v = keys.transpose(1, 2), values.transpose(1, 2)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
