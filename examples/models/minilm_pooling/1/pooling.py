"""Masked mean pooling and L2 normalisation of BERT token embeddings (numpy only).

Kept apart from model.py so the benchmark's in-process baseline and the tests run the very same
function the server does.
"""

import numpy as np


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``hidden`` [batch, seq, dim] and ``mask`` [batch, seq] -> unit-length [batch, dim] FP32.

    Padding tokens (mask 0) do not count; the clamps match sentence-transformers (1e-9 tokens,
    1e-12 norm), so an all-padding row comes out as zeros instead of NaN.
    """
    if hidden.ndim != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"ATTENTION_MASK shape {list(mask.shape)} does not match TOKEN_EMBEDDINGS shape "
            f"{list(hidden.shape)}: expected [batch, seq] and [batch, seq, dim]"
        )
    weights = mask.astype(np.float32)[:, :, None]
    summed = np.einsum("bsd,bsx->bd", hidden.astype(np.float32, copy=False), weights)
    mean = summed / np.maximum(weights.sum(axis=1), 1e-9)
    norm = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return (mean / norm).astype(np.float32, copy=False)
