"""Round-to-nearest block quantisation of float weights for MatMulNBits (pure NumPy).

Symmetric, per block of 32 values along K, as onnxruntime's default weight-only quantiser does
it (the one the reference builder runs): the value of largest magnitude ``v`` in a block sets
``scale = v / -2^(bits-1)``; codes are ``w * (1 / scale) + 2^(bits-1)`` in fp32, rounded to the
nearest integer with halves rounded up, clipped to the code range, with the zero point at its
default ``2^(bits-1)``. The same inputs give the same
bytes as that quantiser (checked against it in the tests), so an int4 import of a float
checkpoint holds the reference export's weights.

``asym_blocks`` re-rounds values that are already on a coarse grid (a GGUF ``Q4_K`` block's
``d * sc * q - dmin * m``) onto MatMulNBits' own asymmetric form, ``(q - z) * scale`` with an
integer zero point ``z`` per block: no float offset, so no second MatMul over block sums (what
``--quant int4-lean`` writes). Per block it tries a few grids (the block's range over the code
range, slightly narrower and wider, and a hinted scale such as the GGUF sub-block's own), refits
each grid's scale by least squares to its codes, and keeps the one of least squared error.
"""

from __future__ import annotations

import numpy as np

from .weights import Blocks

RTN_BLOCK = 32
# --quant value -> MatMulNBits bits (None: float weights).
QUANTS: dict[str, int | None] = {
    "int4": 4,
    "int4-wide": 4,
    "int4-lean": 4,
    "int8": 8,
    "int8-wide": 8,
    "fp16": None,
    "fp32": None,
}
LEAN = "int4-lean"
# int4-wide / int8-wide: 8-bit blocks narrower than WIDE_EIGHT (Q6_K's 16, Q5_0's 32) become
# symmetric 8-bit blocks of WIDE_EIGHT when that adds at most WIDE_EIGHT_LIMIT times the source's
# own rounding noise (its step^2 / 12): onnxruntime's int8-activation kernels run wide blocks
# faster, and a wide block's scale and zero point cost fewer bytes.
WIDE_EIGHT = 128
WIDE_EIGHT_LIMIT = 0.25
# int4-lean: a 4-bit block with a float offset (Q4_K, Q4_1) tries blocks of LEAN_WIDE first and
# keeps them when their re-rounding error (mean square, against the source's values) is at most
# LEAN_WIDE_LIMIT times the source's own rounding noise (its step^2 / 12); else blocks of 32.
LEAN_WIDE = 64
LEAN_WIDE_LIMIT = 1.0
# int4-lean output head (untied, or the tied embedding): 8-bit blocks of 32 (4 keeps fewer bytes).
LEAN_HEAD_BITS = 8
ASYM_FACTORS = (1.0, 0.94, 1.06)  # candidate grids: range / (2^bits - 1) times these
ASYM_ROWS = 4096  # rows re-rounded at a time: the temporaries stay small


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


def asym_blocks(
    w: np.ndarray, bits: int, block: int = RTN_BLOCK, hint: np.ndarray | None = None
) -> Blocks:
    """``w`` [N, K] as asymmetric ``bits``-bit blocks of ``block`` values: codes ``q`` and
    integer zero points ``z`` in [0, 2^bits - 1], fp32 scales, ``W = (q - z) * scale``.
    ``hint`` [N, K/block]: one more candidate scale per block (e.g. the source's own)."""
    n, k = w.shape
    nb = k // block
    codes = np.empty((n, nb, block), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zeros = np.empty((n, nb), np.uint8)
    for start in range(0, n, ASYM_ROWS):
        rows = slice(start, start + ASYM_ROWS)
        x = np.ascontiguousarray(w[rows], dtype=np.float32).reshape(-1, nb, block)
        q, s, z = _asym_chunk(x, bits, None if hint is None else hint[rows])
        codes[rows], scales[rows], zeros[rows] = q, s, z
    return Blocks(bits, codes, scales, zeros)


def _asym_chunk(
    x: np.ndarray, bits: int, hint: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top = np.float32((1 << bits) - 1)
    lo = np.minimum(x.min(-1), 0)  # the grid holds 0 (z is an integer code)
    hi = np.maximum(x.max(-1), 0)
    span = (hi - lo) / top
    candidates = [span * np.float32(f) for f in ASYM_FACTORS]
    if hint is not None:
        candidates.append(np.abs(hint).astype(np.float32))
    best_err = best_q = best_s = best_z = None
    for scale in candidates:
        s = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
        z = np.clip(np.rint(-lo / s), 0, top)
        for _ in range(2):  # round to the grid, refit the scale to the codes, once more
            q = np.clip(np.rint(x / s[..., None]) + z[..., None], 0, top)
            d = q - z[..., None]
            den = (d * d).sum(-1)
            fit = (x * d).sum(-1) / np.where(den > 0, den, 1)
            s = np.where(fit > 0, fit, np.float32(1)).astype(np.float32)
        err = ((x - s[..., None] * d) ** 2).sum(-1)
        if best_err is None:
            best_err, best_q, best_s, best_z = err, q, s, z
            continue
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_q = np.where(better[..., None], q, best_q)
        best_s = np.where(better, s, best_s)
        best_z = np.where(better, z, best_z)
    assert best_q is not None and best_s is not None and best_z is not None
    return best_q.astype(np.uint8), best_s.astype(np.float32), best_z.astype(np.uint8)


def lean_blocks(native: Blocks, head: bool = False) -> tuple[Blocks, str]:
    """A checkpoint's own blocks in ``int4-lean``'s form, and how (for the import report).

    4-bit blocks with a float offset (Q4_K's ``-dmin * m``, Q4_1's ``m``) are re-rounded to
    integer zero points (``asym_blocks``); 4-bit blocks without one (Q4_0) stay as they are.
    Wider codes stay exact when they are already symmetric blocks of 32 (Q8_0, Q5_0); others
    (Q6_K's blocks of 16, Q5_K / Q5_1 with offsets) become symmetric 8-bit blocks of 32. The
    output head follows ``LEAN_HEAD_BITS``."""
    if head and LEAN_HEAD_BITS == 4 and (native.bits == 8 or native.offsets is not None):
        return asym_blocks(native.dequantize(), 4), f"asymmetric 4-bit blocks of {RTN_BLOCK}"
    if native.bits == 8:
        if native.offsets is None and native.block == RTN_BLOCK:
            return native, "exact"
        return rtn_blocks(native.dequantize(), 8), f"8-bit blocks of {RTN_BLOCK}, re-rounded"
    if native.offsets is None:
        return native, "exact"
    w = native.dequantize()
    k = w.shape[1]
    if native.block == RTN_BLOCK and k % LEAN_WIDE == 0 and LEAN_WIDE_LIMIT > 0:
        wide = asym_blocks(w, 4, LEAN_WIDE)
        own = float(np.mean(np.square(native.scales, dtype=np.float64))) / 12
        if mean_square_error(wide, w) <= LEAN_WIDE_LIMIT * own:
            return wide, f"zero points, blocks of {LEAN_WIDE}, re-rounded"
    hint = native.scales if native.block == RTN_BLOCK else None
    return asym_blocks(w, 4, RTN_BLOCK, hint), f"zero points, blocks of {RTN_BLOCK}, re-rounded"


def wide_eight_bit(native: Blocks) -> tuple[Blocks, str]:
    """8-bit ``native`` blocks as symmetric 8-bit blocks of ``WIDE_EIGHT`` where the re-rounding
    error stays within ``WIDE_EIGHT_LIMIT`` of the source's own rounding noise, else unchanged;
    and how (for the import report). Rounded a block of rows at a time: bounded temporaries."""
    n, k = native.shape
    if native.bits != 8 or native.block >= WIDE_EIGHT or k % WIDE_EIGHT:
        return native, "exact"
    parts, err = [], 0.0
    for start in range(0, n, ASYM_ROWS):
        w = native.rows(np.arange(start, min(n, start + ASYM_ROWS))).dequantize()
        part = rtn_blocks(w, 8, WIDE_EIGHT)
        err += float(np.square(part.dequantize() - w, dtype=np.float64).sum())
        parts.append(part)
    own = float(np.mean(np.square(native.scales, dtype=np.float64))) / 12
    if err / (n * k) > WIDE_EIGHT_LIMIT * own:
        return native, "exact"
    return Blocks.stack(parts), f"8-bit blocks of {WIDE_EIGHT}, re-rounded"


def mean_square_error(blocks: Blocks, w: np.ndarray) -> float:
    """Mean of (blocks' weights - w)^2 over every value, a block of rows at a time."""
    total = 0.0
    for start in range(0, w.shape[0], ASYM_ROWS):
        rows = slice(start, start + ASYM_ROWS)
        part = Blocks(blocks.bits, blocks.codes[rows], blocks.scales[rows],
                      blocks.zero_points[rows])  # fmt: skip
        total += float(np.square(part.dequantize() - w[rows], dtype=np.float64).sum())
    return total / w.size
