"""CPU kernels in plain C, built on first use with the machine's gcc and called through ctypes:
decode attention over the paged cache (`paged_attention.c`), the decoder layer's fused
element-wise ops (`fused_ops.c`: RMSNorm with the residual add, rotary embedding, SiLU-gating),
8-bit linear layers with 15-bit activations, on AVX512-VNNI where the CPU has it and in
portable C elsewhere (`q8_linear.c`), bf16 linear layers on AVX-512, with or without its BF16
extension (`bf16_linear.c`), and a decode step's decoder layers strung together from those in
one call (`decoder.c`, called through `decoder.py`). Their jobs run on torch's OpenMP threads
(`thread_pool.c`).

Why not a torch C++ extension: one including torch's headers takes about a minute to compile
on two cores, while this C file builds in under a second and needs nothing but gcc (which CI
has). The library is built for this CPU (`-march=native`) into the cache directory
(`$NAIAD_CACHE_DIR`, else a per-user folder under the temp dir), keyed by the source and the
CPU; a build that fails leaves the torch reference in charge. `NAIAD_LLM_KERNELS=0` turns the
kernels off (to compare against the reference); `NAIAD_LLM_VNNI=0` keeps `q8_linear` on its
portable path on a CPU that has VNNI (to test that path, or to compare); `NAIAD_LLM_BF16_KERNEL=0`
keeps bf16 models on oneDNN's linears.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "paged_attention.c", HERE / "fused_ops.c", HERE / "q8_linear.c", HERE / "thread_pool.c",
           HERE / "decoder.c", HERE / "bf16_linear.c"]
HEADERS = [HERE / "common.h", HERE / "thread_pool.h"]
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False
_cpu_answers: dict[str, bool] = {}  # what the library's CPU checks said, asked once each


def cache_dir() -> Path:
    base = os.environ.get("NAIAD_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"naiad-{os.getuid()}")
    return Path(base) / "kernels"


def _cpu_key() -> str:
    """What `-march=native` depends on: the architecture and the CPU's model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "|" + "|".join(lines)


def _build() -> Path | None:
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        log.warning("no C compiler found: the LLM engine uses its torch attention on the CPU")
        return None
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    key = hashlib.sha256(source + _cpu_key().encode()).hexdigest()[:16]
    target = cache_dir() / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    base = [compiler, "-O3", "-march=native", "-ffast-math", "-pthread", "-shared", "-fPIC"]
    # OpenMP: the kernels' jobs run on torch's own OpenMP threads (thread_pool.c); a compiler
    # without it builds them to run on one thread.
    for command in ([*base, "-fopenmp", *map(str, SOURCES), "-o", str(partial), "-lm"],
                    [*base, *map(str, SOURCES), "-o", str(partial), "-lm"]):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0:
            break
    else:
        log.warning("building the CPU kernels failed (%s): using the torch reference\n%s",
                    " ".join(command), result.stderr[-2000:])
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, target)  # atomic: a concurrent build of the same key loses nothing
    return target


def library() -> ctypes.CDLL | None:
    """The kernels' library, built and loaded once per process; None when it cannot be had."""
    global _library, _tried
    with _lock:
        if _tried:
            return _library
        _tried = True
        if os.environ.get("NAIAD_LLM_KERNELS", "1") == "0":
            return None
        path = _build()
        if path is None:
            return None
        lib = ctypes.CDLL(str(path))
        function = lib.paged_decode_attention
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 6, *[ctypes.c_int64] * 7, ctypes.c_float,
                             ctypes.c_int64]
        lib.rms_norm.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 5, ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
        lib.rotary.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 6]
        lib.silu_mul.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        lib.q8_linear.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 3, ctypes.c_int, *[ctypes.c_void_p] * 3,
                                  ctypes.c_int64, ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_int]
        lib.q8_has_vnni.argtypes = []
        lib.decode_layers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_int, *[ctypes.c_void_p] * 5]
        lib.decode_tokens.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_void_p] * 6]
        lib.decode_head.argtypes = [*[ctypes.c_void_p] * 6, ctypes.c_int64, ctypes.c_void_p]
        lib.bf16_linear.argtypes = [*[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 4]
        lib.bf16_linear_supported.argtypes = []
        for name in ("rms_norm", "rotary", "silu_mul", "q8_linear", "q8_has_vnni", "decode_layers", "decode_tokens",
                     "decode_head", "bf16_linear", "bf16_linear_supported"):
            getattr(lib, name).restype = ctypes.c_int
        _library = lib
        return _library


def supports(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in _DTYPES and library() is not None


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`q` `[rows, heads, d]`, one query per row, over the paged cache; see paged_attention.c.

    The rows (and, with fewer rows than threads, their heads) are split over as many threads as
    torch uses.

    Call only where `supports(q)`; the tensors are made contiguous (and int64) here.
    """
    lib = library()
    assert lib is not None, "paged_decode_attention called without the kernel library"
    q = q.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV cache must be contiguous")
    rows, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    status = lib.paged_decode_attention(
        _DTYPES[q.dtype], q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
        out.data_ptr(), rows, heads, kv_heads, head_dim, block_size, tables.shape[1] if tables.dim() == 2 else 0,
        sliding_window or 0, scale, torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("the attention kernel could not allocate its scratch memory")
    return out


def _check(status: int, what: str) -> None:
    if status != 0:
        raise MemoryError(f"the {what} kernel could not allocate its scratch memory")


def _lib() -> ctypes.CDLL:
    lib = library()
    assert lib is not None, "a CPU kernel was called without the kernel library (check supports() first)"
    return lib


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of the rows of `x` (after adding `residual`, when given); returns (normed, x + residual)."""
    x = x.contiguous()
    rows, dim = x.numel() // x.shape[-1], x.shape[-1]
    out = torch.empty_like(x)
    summed = None
    if residual is not None:
        residual = residual.contiguous()
        summed = torch.empty_like(x)
    _check(_lib().rms_norm(_DTYPES[x.dtype], x.data_ptr(), None if residual is None else residual.data_ptr(),
                           None if summed is None else summed.data_ptr(), weight.contiguous().data_ptr(),
                           out.data_ptr(), rows, dim, eps), "rms_norm")
    return out, summed


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate `q` `[tokens, heads, d]` and `k` `[tokens, kv_heads, d]` in place; each token's heads
    must be contiguous (the tokens may be strided, as views into a fused qkv output)."""
    tokens, heads, head_dim = q.shape
    for t in (q, k):
        if t.stride(2) != 1 or t.stride(1) != head_dim:
            raise ValueError("rotary_ needs each token's heads contiguous")
    cos, sin = cos.reshape(tokens, head_dim).contiguous(), sin.reshape(tokens, head_dim).contiguous()
    _check(_lib().rotary(_DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads,
                         k.shape[1], head_dim, q.stride(0), k.stride(0)), "rotary")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for rows `[gate | up]`."""
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    _check(_lib().silu_mul(_DTYPES[gate_up.dtype], gate_up.data_ptr(), out.data_ptr(), out.numel() // inter, inter),
           "silu_mul")
    return out


#: `q8_linear`'s weight scales: one float16 per block of 32 inputs, or a float16 scale and
#: minimum per block (w = d * q + m, GGUF's Q4_1).
SCALE_BLOCK_F16, SCALE_BLOCK_F16_MIN = 0, 1


def has_vnni() -> bool:
    """Whether `q8_linear` runs on AVX512-VNNI here (the CPU has it, the build used it, and
    `NAIAD_LLM_VNNI` is not "0")."""
    return _library_says("q8_has_vnni") and vnni_wanted()


def _library_says(check: str) -> bool:
    """A CPU check of the library's (`q8_has_vnni`, `bf16_linear_supported`); False without it."""
    lib = library()
    if lib is None:
        return False
    if check not in _cpu_answers:
        _cpu_answers[check] = bool(getattr(lib, check)())
    return _cpu_answers[check]


def vnni_wanted() -> bool:
    """Whether `NAIAD_LLM_VNNI` lets q8_linear take its VNNI path (the C code checks the CPU)."""
    return os.environ.get("NAIAD_LLM_VNNI", "1") != "0"


def q8_columns(
    packed: torch.Tensor, scales: torch.Tensor, columns: torch.Tensor | None, column_weights: torch.Tensor | None
) -> tuple[int, int | None, int | None]:
    """q8_linear's outlier columns as (count, columns' address, their weights' address), after
    checking the float16 scales and the column weights' shape and type."""
    ncols = 0 if columns is None else columns.numel()
    if scales.dtype != torch.float16 or (column_weights is not None and column_weights.dtype != torch.float16):
        raise ValueError("q8_linear's scales and column weights are float16")
    if columns is None or not ncols:
        return 0, None, None
    if column_weights is None or column_weights.shape != (packed.shape[0], ncols, 16):
        raise ValueError(f"{ncols} outlier columns need float16 weights [{packed.shape[0]}, {ncols}, 16]")
    return ncols, columns.data_ptr(), column_weights.data_ptr()


def q8_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    scale_kind: int,
    bias: torch.Tensor | None,
    out_features: int,
    columns: torch.Tensor | None = None,
    column_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W.T + bias` for 8-bit `W` in q8_linear.c's panel layout (`packed` uint8
    `[panels, in_pad / 4, 16, 4]`, float16 `scales` as `scale_kind` says); `x`'s rows are quantized
    to 15 bits per block of 32 inside. `columns` (int64) are inputs multiplied in float by
    `column_weights` (float16 `[panels, len(columns), 16]`; zero in `packed`). Float32 `bias`; the
    result in `x`'s dtype."""
    x = x.contiguous()
    in_features = x.shape[-1]
    rows, in_pad = x.numel() // in_features, packed.shape[1] * 4
    ncols, columns_at, column_weights_at = q8_columns(packed, scales, columns, column_weights)
    out = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype, device=x.device)
    status = _lib().q8_linear(_DTYPES[x.dtype], x.data_ptr(), packed.data_ptr(), scales.data_ptr(), scale_kind,
                              None if bias is None else bias.data_ptr(), columns_at, column_weights_at, ncols,
                              out.data_ptr(), rows, in_features, in_pad, out_features, torch.get_num_threads(),
                              int(vnni_wanted()))
    if status == -2:
        raise ValueError(f"packed weights of {in_pad} inputs do not fit {in_features} (a multiple of 32 at least), "
                         f"or bad outlier columns")
    _check(status, "q8_linear")
    return out


#: bf16_linear.c's panels: output channels per 64-byte row of weights.
BF16_PANEL = 16
#: ... and panels per group, stored interleaved (one stream per group).
BF16_GROUP = 4


def has_bf16_linear() -> bool:
    """Whether `bf16_linear` runs here (the CPU has AVX-512 F/BW/VL and the build used it), unless
    `NAIAD_LLM_BF16_KERNEL=0` turns it off (bf16 models then keep oneDNN's linears, to compare)."""
    return os.environ.get("NAIAD_LLM_BF16_KERNEL", "1") != "0" and _library_says("bf16_linear_supported")


def bf16_panels(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight `[out, in]` in bf16_linear.c's layout (the padding, to whole panels and an even
    width, zero): the memory of `[panels, in_pad / 2, 16, 2]`, the panels stored in groups of
    `BF16_GROUP`, each group interleaved pair by pair (`[in_pad / 2, its panels, 16, 2]`) so that
    the kernel reads a group as one stream."""
    out_features, in_features = weight.shape
    panels, in_pad = -(-out_features // BF16_PANEL), in_features + (in_features & 1)
    padded = weight.new_zeros(panels * BF16_PANEL, in_pad, dtype=torch.bfloat16)
    padded[:out_features, :in_features] = weight
    pairs = in_pad // 2
    by_panel = padded.view(panels, BF16_PANEL, pairs, 2).transpose(1, 2)  # [panels, pairs, 16, 2]
    whole = panels - panels % BF16_GROUP  # the panels in full groups; the rest form a smaller last one
    groups = by_panel[:whole].reshape(whole // BF16_GROUP, BF16_GROUP, pairs, BF16_PANEL, 2).transpose(1, 2)
    last = by_panel[whole:].transpose(0, 1)
    return torch.cat([groups.flatten(), last.flatten()]).view(panels, pairs, BF16_PANEL, 2)


def check_bf16_weights(panels: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int) -> None:
    """ValueError unless `panels` (and `bias`) are what bf16_linear takes for a layer of this shape."""
    if (panels.dtype != torch.bfloat16 or not panels.is_contiguous() or panels.dim() != 4
            or panels.shape[1] * 2 != in_features + (in_features & 1) or panels.shape[0] * BF16_PANEL < out_features):
        raise ValueError(f"bf16_linear takes contiguous bf16 panels of {in_features} inputs and {out_features} outputs")
    if bias is not None and (bias.dtype != torch.bfloat16 or bias.numel() != out_features or not bias.is_contiguous()):
        raise ValueError("bf16_linear's bias is a contiguous bf16 vector of the outputs")


def bf16_linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """`x @ W.T + bias` in bf16 for `W` in `bf16_panels`' layout; call only where `has_bf16_linear()`."""
    x = x.contiguous()
    in_features = x.shape[-1]
    rows = x.numel() // in_features
    if x.dtype != torch.bfloat16:
        raise ValueError(f"bf16_linear takes bf16 x, not {x.dtype}")
    check_bf16_weights(panels, bias, in_features, out_features)
    out = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype, device=x.device)
    status = _lib().bf16_linear(x.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(),
                                out.data_ptr(), rows, in_features, out_features, torch.get_num_threads())
    if status == -3:
        raise RuntimeError("bf16_linear needs AVX-512 (check has_bf16_linear() first)")
    _check(status, "bf16_linear")
    return out
