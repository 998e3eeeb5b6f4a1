"""Round-to-nearest block quantisation of float weights for MatMulNBits (pure NumPy).

Symmetric, per block of 32 values along K, as onnxruntime's default weight-only quantiser does
it (the one the reference builder runs): the value of largest magnitude ``v`` in a block sets
``scale = v / -2^(bits-1)``; codes are ``w * (1 / scale) + 2^(bits-1)`` in fp32, rounded to the
nearest integer with halves rounded up, clipped to the code range, with the zero point at its
default ``2^(bits-1)``. The same inputs give the same
bytes as that quantiser (checked against it in the tests), so an int4 import of a float
checkpoint holds the reference export's weights.
"""

from __future__ import annotations

import numpy as np

from .weights import Blocks

RTN_BLOCK = 32
# --quant value -> MatMulNBits bits (None: float weights).
QUANTS: dict[str, int | None] = {"int4": 4, "int8": 8, "fp16": None, "fp32": None}


def rtn_blocks(w: np.ndarray, bits: int, block: int = RTN_BLOCK) -> Blocks:
    """``w`` [N, K] (K a multiple of ``block``) as symmetric ``bits``-bit blocks."""
    n, k = w.shape
    blocks = np.ascontiguousarray(w, dtype=np.float32).reshape(n, k // block, block)
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    half = 1 << (bits - 1)
    scale = (peak / np.float32(-half)).astype(np.float32)
    nonzero = scale != 0
    recip = np.zeros_like(scale)
    recip[nonzero] = np.float32(1.0) / scale[nonzero]
    x = blocks * recip[..., None] + np.float32(half)
    codes = np.floor(x)
    codes += x - codes >= 0.5  # halves up, as the reference quantiser rounds them
    codes = codes.clip(0, 2 * half - 1).astype(np.uint8)
    return Blocks(bits, codes, scale, np.full(scale.shape, half, np.uint8))
