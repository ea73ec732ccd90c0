import pytest

from naiad.llm.engine.block_manager import Block, BlockManager, FreeBlockQueue, num_blocks_for
from naiad.llm.engine.sequence import Sequence


def _seq(tokens: list[int], seq_id: str = "s") -> Sequence:
    return Sequence(seq_id, tokens, max_tokens=16)


def _computed(bm: BlockManager, tokens: list[int], seq_id: str = "s") -> Sequence:
    """A sequence whose prompt went through allocate and one full prefill step."""
    seq = _seq(tokens, seq_id)
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    bm.mark_computed(seq, seq.num_uncomputed_tokens)
    return seq


def _free_order(bm: BlockManager) -> list[int]:
    return [block.block_id for block in bm.free_queue]


def test_num_blocks_for_divides_memory_by_the_size_of_one_block():
    # K and V, 12 layers, 16 tokens, 12 heads of 64, 2 bytes: 589,824 bytes a block.
    assert num_blocks_for(1 << 30, 16, 12, 12, 64, 2) == (1 << 30) // 589_824
    assert num_blocks_for(589_823, 16, 12, 12, 64, 2) == 0
    with pytest.raises(ValueError):
        num_blocks_for(1 << 30, 0, 12, 12, 64, 2)


def test_allocate_covers_every_token_and_free_returns_every_block():
    bm = BlockManager(8, 4)
    seq = _seq(list(range(9)))
    bm.allocate(seq)
    assert seq.block_table == [0, 1, 2]  # 4 + 4 + 1 tokens
    assert [bm.blocks[i].ref_count for i in seq.block_table] == [1, 1, 1]
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 8 and bm.usage == 0.0
    assert all(block.ref_count == 0 for block in bm.blocks)


def test_can_allocate_refuses_a_prompt_that_does_not_fit():
    bm = BlockManager(2, 4)
    assert bm.can_allocate(_seq(list(range(8))))
    assert not bm.can_allocate(_seq(list(range(9))))


def test_a_shared_prefix_is_allocated_once_and_ref_counted():
    bm = BlockManager(16, 4)
    prefix = list(range(100, 108))  # two full blocks
    a = _computed(bm, [*prefix, 1, 2], "a")
    b = _seq([*prefix, 3], "b")
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == b.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    assert bm.num_used_blocks == 4
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    assert bm.num_used_blocks == 3
    bm.free(b)
    assert bm.num_used_blocks == 0
    assert bm.prefix_cache_queries == 10 + 9 and bm.prefix_cache_hits == 8


def test_a_hit_on_a_block_needs_a_hit_on_every_block_before_it():
    bm = BlockManager(16, 2)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    c = _seq([9, 9, 3, 4, 5], "c")  # the second block's tokens match, the first's do not
    bm.allocate(c)
    assert c.num_cached_tokens == 0
    assert not set(c.block_table) & set(a.block_table)
    # The hash chains: equal tokens under a different parent hash differently.
    assert c.block_hashes[1] != a.block_hashes[1]


def test_only_computed_full_blocks_are_cached():
    bm = BlockManager(16, 4)
    a = _seq(list(range(10)), "a")
    bm.allocate(a)
    b = _seq(list(range(10)), "b")
    bm.allocate(b)  # a's KV is not written yet: nothing to share
    assert b.num_cached_tokens == 0
    bm.mark_computed(a, 6)  # one full block computed, the second half done
    assert [bm.blocks[i].hash is not None for i in a.block_table] == [True, False, False]
    bm.mark_computed(a, 4)  # the partial last block is never cached
    assert [bm.blocks[i].hash is not None for i in a.block_table] == [True, True, False]


def test_a_fully_cached_prompt_still_computes_its_last_block():
    bm = BlockManager(16, 4)
    a = _computed(bm, list(range(8)), "a")
    b = _seq(list(range(8)), "b")
    bm.allocate(b)
    # A whole-block hit would leave nothing to compute and no logits for the next token.
    assert b.num_cached_tokens == 4 and b.num_uncomputed_tokens == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_a_forced_hash_collision_never_shares_kv():
    bm = BlockManager(16, 2, hash_fn=lambda parent, tokens: 7)  # every block hashes alike
    a = _computed(bm, [1, 2, 1, 2, 5], "a")
    b = _seq([5, 6, 7], "b")
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table[0] not in a.block_table
    # Equal tokens at another position: the cached block's parent hash differs, so block 1
    # of `c` does not reuse block 0 of `a`, although both hold [1, 2] under the same hash.
    c = _seq([1, 2, 1, 2, 9], "c")
    bm.allocate(c)
    assert c.num_cached_tokens == 2
    assert c.block_table[0] == a.block_table[0] and c.block_table[1] not in a.block_table
    assert bm.blocks[a.block_table[0]].ref_count == 2


def test_freed_blocks_queue_uncached_first_then_lru_with_the_chain_end_first():
    bm = BlockManager(5, 2)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    assert a.block_table == [0, 1, 2]
    bm.free(a)
    # Block 2 holds a partial block (no hash): reused first. Then the never-used blocks,
    # then a's cached blocks, the end of its chain before its first block.
    assert _free_order(bm) == [2, 3, 4, 1, 0]


def test_eviction_takes_the_lru_head_and_clears_its_hash():
    bm = BlockManager(5, 2)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    bm.free(a)
    x = _computed(bm, [7, 7, 7, 7, 7, 7, 7], "x")  # takes 2, 3, 4 and then evicts 1
    assert x.block_table == [2, 3, 4, 1]
    assert bm.blocks[1].hash is None and bm.blocks[0].hash is not None
    assert _free_order(bm) == [0]
    bm.free(x)
    again = _seq([1, 2, 3, 4, 5], "again")
    bm.allocate(again)
    assert again.num_cached_tokens == 2 and again.block_table[0] == 0  # block 1 is gone


def test_a_hit_takes_a_cached_free_block_out_of_the_middle_of_the_queue():
    bm = BlockManager(6, 2)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    b = _computed(bm, [8, 8, 9], "b")
    bm.free(a)
    bm.free(b)
    assert _free_order(bm) == [4, 2, 5, 1, 0, 3]
    c = _seq([1, 2, 3, 4, 6], "c")
    assert bm.can_allocate(c)
    bm.allocate(c)
    assert c.block_table == [0, 1, 4]
    assert _free_order(bm) == [2, 5, 3] and bm.num_free_blocks == 3
    assert [bm.blocks[i].ref_count for i in c.block_table] == [1, 1, 1]


def test_can_allocate_counts_hits_on_cached_free_blocks_as_taken():
    bm = BlockManager(3, 2)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    bm.free(a)
    bm.allocate(_seq([9, 9], "hold"))  # one block in use, two cached free ones left
    c = _seq([1, 2, 3, 4, 5], "c")
    assert not bm.can_allocate(c)  # 2 hits + 1 fresh block, but only 2 blocks are free


def test_caching_off_shares_nothing_and_keeps_no_hashes():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    a = _computed(bm, [1, 2, 3, 4, 5], "a")
    b = _seq([1, 2, 3, 4, 5], "b")
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    assert a.block_hashes == [] and all(block.hash is None for block in bm.blocks)
    assert bm.prefix_cache_queries == 0 and bm.prefix_cache_hits == 0


def test_append_takes_a_new_block_when_the_last_one_is_full():
    bm = BlockManager(2, 4)
    seq = _computed(bm, [1, 2, 3, 4])
    assert seq.block_table == [0]
    seq.append_token(5)  # position 4 starts block 2
    assert bm.can_append(seq)
    bm.may_append(seq)
    assert seq.block_table == [0, 1]
    bm.mark_computed(seq, 1)
    for token in (6, 7, 8):
        seq.append_token(token)
        bm.may_append(seq)  # still within block 1
        bm.mark_computed(seq, 1)
    assert seq.block_table == [0, 1] and bm.blocks[1].hash is not None  # full and computed
    seq.append_token(9)
    assert not bm.can_append(seq)


def test_free_queue_links_stay_consistent():
    blocks = [Block(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.appendleft(blocks[2])
    queue.remove(blocks[1])
    assert [b.block_id for b in queue] == [2, 0, 3] and len(queue) == 3
    assert queue.popleft() is blocks[2]
    queue.append(blocks[1])
    assert [b.block_id for b in queue] == [0, 3, 1]
    for _ in range(3):
        queue.popleft()
    assert len(queue) == 0
    with pytest.raises(IndexError):
        queue.popleft()
