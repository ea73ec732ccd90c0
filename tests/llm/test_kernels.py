"""The C decode-attention kernel against the torch reference, and its fallbacks."""

from __future__ import annotations

import ctypes
import itertools
from pathlib import Path

import pytest
import torch

from naiad.llm import kernels
from naiad.llm.layers.attention import AttentionMetadata, decode_reference

BLOCK = 16
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _case(dtype: torch.dtype, heads: int, kv_heads: int, lens: list[int], num_blocks: int = 64, head_dim: int = 64):
    generator = torch.Generator().manual_seed(0)
    shape = (num_blocks, BLOCK, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    # Shuffled blocks, so that a kernel reading them in order would be caught.
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, used = [], 0
    for length in lens:
        count = -(-length // BLOCK)
        tables.append(order[used : used + count])
        used += count
    meta = AttentionMetadata.build([1] * len(lens), lens, tables, BLOCK, "cpu")
    q = torch.randn(len(lens), heads, head_dim, generator=generator).to(dtype)
    return q, (k_cache, v_cache), meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2)])
def test_kernel_matches_the_reference(dtype: torch.dtype, heads: int, kv_heads: int) -> None:
    assert kernels.library() is not None, "gcc could not build the kernel on this machine"
    q, cache, meta = _case(dtype, heads, kv_heads, [1, 15, 16, 17, 100, 200])
    scale = 64**-0.5
    out = kernels.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    expected = decode_reference(q, cache, meta, scale)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 80, 128])
def test_kernel_matches_the_reference_at_other_head_sizes(dtype: torch.dtype, head_dim: int) -> None:
    """128 has its own specialisation in paged_attention.c; 32 and 80 take the generic loop."""
    q, cache, meta = _case(dtype, 6, 2, [1, 16, 33, 150], head_dim=head_dim)
    scale = head_dim**-0.5
    out = kernels.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    expected = decode_reference(q, cache, meta, scale)
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("window", [1, 7, 16, 500])
def test_kernel_matches_the_reference_with_a_sliding_window(window: int) -> None:
    q, cache, meta = _case(torch.float32, 8, 2, [1, 6, 7, 40, 200])
    out = kernels.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, 0.125, window)
    expected = decode_reference(q, cache, meta, 0.125, window)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if window < 200:  # the window changes the longest row's answer
        full = decode_reference(q, cache, meta, 0.125)
        assert not torch.allclose(out[-1], full[-1], atol=1e-3)


def test_kernel_reads_only_each_rows_context() -> None:
    """Slots past a row's length (and padding entries of its table) must not change its output."""
    q, (k_cache, v_cache), meta = _case(torch.float32, 4, 4, [5, 40])
    scale = 0.125
    before = kernels.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                            meta.decode_context_lens, scale)
    first_block = int(meta.decode_block_tables[0, 0])
    k_cache[first_block, 5:] = float("nan")  # row 0 has 5 tokens: slots 5.. of its block are unused
    v_cache[first_block, 5:] = float("nan")
    after = kernels.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                           meta.decode_context_lens, scale)
    torch.testing.assert_close(after, before)


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """A kernels module that has not tried to build yet, caching into an empty folder."""
    monkeypatch.setattr(kernels, "_tried", False)
    monkeypatch.setattr(kernels, "_library", None)
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_library_is_built_into_the_cache_dir(fresh_library) -> None:
    assert kernels.library() is not None
    assert list((fresh_library / "kernels").glob("cpu_kernels-*.so"))


def test_no_compiler_means_the_reference(fresh_library, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert kernels.library() is None
    q, _, _ = _case(torch.float32, 4, 4, [3])
    assert not kernels.supports(q)


def test_a_failing_build_means_the_reference(fresh_library, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "false")  # exits 1, as a compiler that rejects the source would
    assert kernels.library() is None
    assert not list((fresh_library / "kernels").glob("*.so"))


def test_kernels_can_be_turned_off(fresh_library, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_LLM_KERNELS", "0")
    assert kernels.library() is None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's memory map (Linux)")
class _TileRun(ctypes.Structure):
    _fields_ = [("next_end", ctypes.c_uint64), ("_line", ctypes.c_uint8 * 56)]  # thread_pool.h: a cache line each


def _take_all(runs: ctypes.Array, jobs: int, order: list[int]) -> list[tuple[int, int]]:
    """(job, tile) for every tile claimed, the jobs asking in turn as `order` says until none is left."""
    lib, taken = kernels.library(), []
    lib.tiles_next.restype = ctypes.c_int64
    for job in itertools.cycle(order):
        tile = lib.tiles_next(runs, jobs, job)
        if tile < 0:
            return taken
        taken.append((job, tile))


def test_jobs_take_their_own_run_in_order_then_the_ends_of_the_others() -> None:
    lib = kernels.library()
    assert lib is not None
    runs = (_TileRun * 3)()
    lib.tiles_split(runs, 3, ctypes.c_int64(10))  # runs [0, 3), [3, 6), [6, 10)
    # job 2 alone (the others held up): its run first, front to back, then the others' from the back
    assert _take_all(runs, 3, [2]) == [(2, t) for t in (6, 7, 8, 9, 2, 1, 0, 5, 4, 3)]
    lib.tiles_split(runs, 3, ctypes.c_int64(1000))
    taken = _take_all(runs, 3, [0, 1, 2, 0, 0, 1])  # uneven speeds
    assert sorted(tile for _, tile in taken) == list(range(1000))  # every tile once
    assert [tile for job, tile in taken if job == 1][:5] == [333, 334, 335, 336, 337]


def test_the_kernels_share_torchs_openmp_runtime() -> None:
    """The kernels' jobs run on torch's OpenMP threads (thread_pool.c): one runtime in the
    process, not a second pool of threads fighting torch's for the cores."""
    assert kernels.library() is not None, "gcc could not build the kernels on this machine"
    torch.ones(1 << 16).sum()  # torch's runtime is loaded and its team started
    # The soname the library asks for; wheels that vendor their own OpenMP rename theirs.
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if line.split()[-1].endswith("/libgomp.so.1")}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (9, 3)])
@pytest.mark.parametrize("lens", [[1, 15, 16, 17, 100, 200, 33], [200], [17, 100]], ids=["7rows", "1row", "2rows"])
def test_attention_is_the_same_on_any_thread_count(threads: int, heads: int, kv_heads: int, lens: list[int]) -> None:
    """Split by rows, or by rows and heads when there are fewer rows than threads: the same bits."""
    assert kernels.library() is not None, "gcc could not build the kernel on this machine"
    q, cache, meta = _case(torch.float32, heads, kv_heads, lens)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, 0.125)
        torch.set_num_threads(threads)
        many = kernels.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(many, one)  # each (row, head) computed whole by one thread, the same way
    expected = decode_reference(q, cache, meta, 0.125)
    torch.testing.assert_close(many, expected, atol=1e-5, rtol=1e-5)
