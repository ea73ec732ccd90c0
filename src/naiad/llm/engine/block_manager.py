"""Paged KV cache bookkeeping: ref-counted blocks, prefix caching, an O(1) LRU free list.

The KV cache is `num_blocks` blocks of `block_size` token slots each (the tensors live in the
model runner; here a block is only its id and metadata). A sequence owns an ordered
`block_table`: token `i` has its KV in block `block_table[i // block_size]`, slot
`i % block_size`.

Invariants:
- A block is either in use (`ref_count > 0`, in one or more block tables) or free (`ref_count
  == 0`, in the free queue); never both.
- A block has a hash only while it is in the prefix cache: it is full, its KV has been written
  (blocks are cached after their tokens are computed, never at allocation), and the cache
  maps that hash to it. The hash is set once and cleared only when the block is evicted, that
  is when the free queue hands it out again.
- Block hashes chain: block `i`'s hash covers the parent hash (block `i - 1`) and its own
  tokens, so a hit on block `i` means a hit on every block before it. A hit is confirmed by
  comparing the cached block's tokens and parent hash, so a hash collision never shares KV.
- Free blocks without a hash are reused first; cached free blocks are evicted least recently
  freed first, and among the blocks of one sequence the end of the chain goes first, so a
  shared prefix outlives the suffixes that hang from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from naiad.llm.engine.sequence import Sequence

HashFn = Callable[[int, tuple[int, ...]], int]

#: The parent hash of a sequence's first block. An int rather than None: in Python 3.11
#: `hash(None)` depends on the process, and block hashes should not.
ROOT_HASH = 0


def hash_block_tokens(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """The chained hash of one full block: the parent block's hash and this block's tokens."""
    return hash((parent_hash, token_ids))


def num_blocks_for(
    memory_bytes: int, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
) -> int:
    """How many KV blocks fit in `memory_bytes`.

    One block holds the keys and the values of `block_size` tokens in every layer:

        bytes_per_block = 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes

    (2 for K and V), and the answer is `memory_bytes // bytes_per_block`.
    """
    sizes = (block_size, num_layers, num_kv_heads, head_dim, dtype_bytes)
    if memory_bytes < 0 or min(sizes) < 1:
        raise ValueError(f"KV cache sizes must be positive: memory={memory_bytes}, sizes={sizes}")
    return memory_bytes // (2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes)


class Block:
    """Metadata of one KV block. `prev`/`next` link it into the free queue while it is free."""

    __slots__ = ("block_id", "hash", "next", "parent_hash", "prev", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        # What the hash stands for, kept to confirm a hit (see `BlockManager._confirms`).
        self.parent_hash = ROOT_HASH
        self.token_ids: tuple[int, ...] = ()
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.hash})"


class FreeBlockQueue:
    """The free blocks as an intrusive doubly linked list, in eviction order (head first).

    A deque cannot drop a block from its middle in O(1), which a prefix hit on a cached free
    block needs. The links live in the blocks themselves, so no operation allocates; two
    sentinels remove the empty-list special cases.
    """

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        block = self._head.next
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next

    def popleft(self) -> Block:
        block = self._head.next
        if block is self._tail or block is None:
            raise IndexError("no free KV block")
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self._len -= 1

    def append(self, block: Block) -> None:
        """Put `block` last: evicted after every block already free."""
        self._link(block, self._tail.prev, self._tail)

    def appendleft(self, block: Block) -> None:
        """Put `block` first: the next one handed out."""
        self._link(block, self._head, self._head.next)

    def _link(self, block: Block, prev: Block | None, nxt: Block | None) -> None:
        assert prev is not None and nxt is not None
        block.prev, block.next = prev, nxt
        prev.next = block
        nxt.prev = block
        self._len += 1


class BlockManager:
    """Hands out KV blocks to sequences and shares the blocks of common prompt prefixes.

    The scheduler pairs the checks with the actions: `can_allocate` → `allocate` when a
    sequence is admitted (blocks for all its tokens, prefix hits included), `can_append` →
    `may_append` before each step of a running sequence (a new block when the last one is
    full), `mark_computed` after a step (caches the blocks that the step filled), `free` when
    it finishes or is preempted. `num_blocks` comes from `num_blocks_for`.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self._hash_fn = hash_fn
        self._cached: dict[int, Block] = {}
        # Prefix-cache counters in tokens, as vLLM's prefix_cache_queries / prefix_cache_hits.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use; cached free blocks count as free (they can be evicted)."""
        return self.num_used_blocks / len(self.blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- admission ---------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether `allocate(seq)` would find enough blocks.

        A hit on a block in use costs nothing; a hit on a cached free block takes it off the
        free queue like a fresh block does.
        """
        hits = self._match_prefix(seq)
        in_use_hits = sum(1 for block in hits if block.ref_count > 0)
        return self.blocks_needed(len(seq)) - in_use_hits <= len(self.free_queue)

    def allocate(self, seq: Sequence) -> None:
        """Give a sequence without blocks the blocks for all its tokens, reusing cached prefixes.

        Sets `num_cached_tokens` and `num_computed_tokens` to the tokens found in the cache.
        """
        assert not seq.block_table, f"{seq} already has blocks"
        hits = self._match_prefix(seq)
        # Take the hits before any fresh block: a fresh pop could otherwise evict one of them.
        for block in hits:
            self._touch(block)
        seq.block_table.extend(block.block_id for block in hits)
        for _ in range(self.blocks_needed(len(seq)) - len(hits)):
            seq.block_table.append(self._pop_free().block_id)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_cache_queries += len(seq)
            self.prefix_cache_hits += seq.num_cached_tokens

    # -- growth ------------------------------------------------------------------------------

    def can_append(self, seq: Sequence) -> bool:
        """Whether the free blocks cover every token of `seq` (after the one it last sampled)."""
        return self.blocks_needed(len(seq)) - len(seq.block_table) <= len(self.free_queue)

    def may_append(self, seq: Sequence) -> None:
        """Add blocks until the block table covers every token; one when the last block filled."""
        while len(seq.block_table) < self.blocks_needed(len(seq)):
            seq.block_table.append(self._pop_free().block_id)

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """Record that the KV of `num_tokens` more tokens is written; cache the blocks they filled."""
        first_new_full = seq.num_computed_tokens // self.block_size
        seq.num_computed_tokens += num_tokens
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        self._hash_full_blocks(seq, num_full)
        for i in range(first_new_full, num_full):
            self._cache(self.blocks[seq.block_table[i]], seq, i)

    # -- release -----------------------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks; its KV is gone, except what stays in the prefix cache."""
        # The end of the table is freed first so that its blocks are evicted before the prefix.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)
        seq.block_table.clear()
        seq.num_computed_tokens = 0

    # -- internals ---------------------------------------------------------------------------

    def _match_prefix(self, seq: Sequence) -> list[Block]:
        """The cached blocks that hold the longest prefix of `seq`, block by block."""
        params = seq.sampling_params
        if not self.enable_prefix_caching or params.prompt_logprobs is not None or params.pooling == "mean":
            return []  # (prompt logprobs and mean pooling need every prompt token computed)
        # At least the last token is computed: its logits give the next token. Hits are whole
        # blocks, so a prompt that is all cached still recomputes its last block, in a block of
        # its own (writing into a shared block would race with its other readers).
        max_hits = (len(seq) - 1) // self.block_size
        self._hash_full_blocks(seq, max_hits)
        hits: list[Block] = []
        for i in range(max_hits):
            block = self._cached.get(seq.block_hashes[i])
            if block is None or not self._confirms(block, seq, i):
                break
            hits.append(block)
        return hits

    def _confirms(self, block: Block, seq: Sequence, i: int) -> bool:
        """Whether a cached block really holds block `i` of `seq`, beyond an equal hash."""
        parent = seq.block_hashes[i - 1] if i else ROOT_HASH
        return block.parent_hash == parent and block.token_ids == self._block_tokens(seq, i)

    def _hash_full_blocks(self, seq: Sequence, num_blocks: int) -> None:
        hashes = seq.block_hashes
        for i in range(len(hashes), num_blocks):
            parent = hashes[i - 1] if i else ROOT_HASH
            hashes.append(self._hash_fn(parent, self._block_tokens(seq, i)))

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _cache(self, block: Block, seq: Sequence, i: int) -> None:
        block_hash = seq.block_hashes[i]
        # A block that is already cached (a prefix hit) keeps its entry. When another block
        # holds the same hash (the same content computed twice, or a collision) the first one
        # stays: block tables never change, so the duplicate simply goes uncached.
        if block.hash is not None or block_hash in self._cached:
            return
        block.hash = block_hash
        block.parent_hash = seq.block_hashes[i - 1] if i else ROOT_HASH
        block.token_ids = self._block_tokens(seq, i)
        self._cached[block_hash] = block

    def _touch(self, block: Block) -> None:
        if block.ref_count == 0:
            self.free_queue.remove(block)
        block.ref_count += 1

    def _pop_free(self) -> Block:
        block = self.free_queue.popleft()
        if block.hash is not None:
            self._evict(block)
        block.ref_count = 1
        return block

    def _evict(self, block: Block) -> None:
        assert block.hash is not None
        del self._cached[block.hash]
        block.hash = None
        block.parent_hash = ROOT_HASH
        block.token_ids = ()
