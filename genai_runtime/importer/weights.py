"""GGUF tensors -> NumPy: fp32 dequantisation, and MatMulNBits blocks taken over unchanged.

``MatMulNBits`` computes ``W[n, k] = (q - zero_point) * scale`` per block of ``block_size``
values along K. GGUF's blocks map onto it without requantising, so every weight equals the
GGUF's dequantised value (an fp16 scale times a small integer is exact in fp32):

- 4 bits: ``Q4_0`` (``d * (q - 8)``, zero point 8), ``Q4_1`` (``d * q + m``) and ``Q4_K``
  (32-value sub-blocks, scale ``d * sc``, offset ``-dmin * m``). An offset is a separate product
  of per-block input sums with the offsets (``x @ M``, K/32 wide): a float zero point would make
  onnxruntime 1.31's CPU kernel dequantise on every call (~13x slower).
- 8 bits (codes wider than 4 bits): ``Q8_0`` (``d * q``), ``Q5_0`` (``d * (q - 16)``), ``Q5_1``
  and ``Q5_K`` (with offsets), ``Q6_K`` (16-value sub-blocks of ``d * sc * (q - 32)``, block 16).
  8-bit MatMulNBits is fast only with int8 activations (accuracy level 4); at level 0 it is ~45x
  slower than an fp32 MatMul, so the importer dequantises these there (``linear.py``).

Everything else (F16, BF16, F32, Q2_K, Q3_K, ...) is dequantised to fp32 by the ``gguf`` package
and quantised again if the chosen ``--quant`` asks for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedError

BLOCK = 32

# GGML type name -> whether MatMulNBits can hold its blocks unchanged.
DEQUANTISABLE = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)
NBITS_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K")
SUPER = 256  # K-quant super-block


def type_name(t: Any) -> str:
    return t.tensor_type.name


def check_type(t: Any, source: str) -> None:
    name = type_name(t)
    if name not in DEQUANTISABLE:
        raise UnsupportedError(
            f"{source}: tensor {t.name!r} has quantisation type {name}, which is not supported; "
            f"supported: {', '.join(DEQUANTISABLE)}"
        )


ROW_CHUNK = 16384  # rows dequantised at a time: the dequantiser's temporaries stay small


def dequantize(t: Any) -> np.ndarray:
    """The tensor as fp32, GGUF row order: [ne1, ne0] = [out_features, in_features] for weights.
    A large table goes a block of rows at a time (262k x 640 for Gemma 3)."""
    from gguf import quants

    data = np.asarray(t.data)
    if len(t.shape) == 1:
        return quants.dequantize(data, t.tensor_type).astype(np.float32, copy=False).reshape(-1)
    out = np.empty((data.shape[0], int(t.shape[0])), np.float32)
    for start in range(0, data.shape[0], ROW_CHUNK):
        part = quants.dequantize(data[start : start + ROW_CHUNK], t.tensor_type)
        out[start : start + ROW_CHUNK] = part.reshape(-1, out.shape[1])
    return out


@dataclass(frozen=True)
class Blocks:
    """A [N, K] 4-bit weight: codes [N, K/32, 32]; scales, zero points, offsets [N, K/32].

    W[n, k] = (code - zero_point) * scale + offset, the offset (Q4_1's ``m``) optional.
    """

    bits: int
    codes: np.ndarray  # uint8, one code per value
    scales: np.ndarray  # float32
    zero_points: np.ndarray  # uint8
    offsets: np.ndarray | None = None  # float32

    @property
    def shape(self) -> tuple[int, int]:
        n, nb, bs = self.codes.shape
        return n, nb * bs

    @property
    def block(self) -> int:
        return int(self.codes.shape[2])

    @property
    def symmetric(self) -> bool:
        """Every zero point is MatMulNBits' default (2^(bits-1)): the input can be left out."""
        return bool((self.zero_points == 1 << (self.bits - 1)).all())

    def widened(self) -> Blocks:
        """The same weights as 8-bit blocks (4-bit codes and zero points fit unchanged)."""
        return self if self.bits == 8 else dataclasses.replace(self, bits=8)

    def dequantize(self) -> np.ndarray:
        """What MatMulNBits computes for W[n, k] (NumPy reference of the operator's math)."""
        zp = self.zero_points.astype(np.float32)[..., None]
        w = (self.codes.astype(np.float32) - zp) * self.scales[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.reshape(self.shape)

    @staticmethod
    def stack(parts: list[Blocks]) -> Blocks:
        """Weights stacked along N (e.g. q, k, v as one projection)."""
        if len(parts) == 1:
            return parts[0]
        if len({(p.bits, p.codes.shape[1:]) for p in parts}) != 1:
            raise ValueError("stacked weights need the same bits and K")
        offsets = None
        if any(p.offsets is not None for p in parts):
            offsets = np.concatenate(
                [p.offsets if p.offsets is not None else np.zeros_like(p.scales) for p in parts]
            )
        return Blocks(
            parts[0].bits,
            np.concatenate([p.codes for p in parts]),
            np.concatenate([p.scales for p in parts]),
            np.concatenate([p.zero_points for p in parts]),
            offsets,
        )

    def rows(self, index: np.ndarray) -> Blocks:
        offsets = None if self.offsets is None else self.offsets[index]
        return Blocks(
            self.bits, self.codes[index], self.scales[index], self.zero_points[index], offsets
        )

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, scales, zero_points) as MatMulNBits takes them (two 4-bit codes per byte)."""
        n, nb, _ = self.codes.shape
        if self.bits == 8:
            return self.codes, self.scales.reshape(-1), self.zero_points.reshape(-1)
        b = (self.codes[..., 0::2] | (self.codes[..., 1::2] << 4)).astype(np.uint8)
        zp = self.zero_points
        if nb % 2:
            zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
        zp = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
        return b, self.scales.reshape(-1), zp.reshape(-1)


def _split(data: np.ndarray, n: int, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(n, -1, block_bytes)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # GGML packs value j in the low nibble of byte j and value j+16 in its high nibble.
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)


def to_blocks(t: Any) -> Blocks | None:
    """The tensor's GGUF blocks as MatMulNBits blocks, or None when its type does not map."""
    name = type_name(t)
    if name not in NBITS_TYPES or len(t.shape) != 2 or int(t.shape[0]) % BLOCK:
        return None
    n = int(t.shape[1])
    raw = np.asarray(t.data, dtype=np.uint8)
    if name in EIGHT_BIT:
        return _eight_bit(t, name, raw, n)
    if name == "Q4_K":
        return _q4_k(_split(raw, n, 144))
    if name == "Q4_0":
        b = _split(raw, n, 18)
        d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
        return Blocks(4, _nibbles(b[..., 2:]), d, np.full(d.shape, 8, np.uint8))
    b = _split(raw, n, 20)  # Q4_1
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return Blocks(4, _nibbles(b[..., 4:]), d, np.zeros(d.shape, np.uint8), m)


# GGML type -> bytes per block (of 32 values, or a 256-value K-quant super-block).
EIGHT_BIT = {"Q8_0": 34, "Q5_0": 22, "Q5_1": 24, "Q5_K": 176, "Q6_K": 210}


def _fp16(b: np.ndarray, at: int) -> np.ndarray:
    return b[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _eight_bit(t: Any, name: str, raw: np.ndarray, n: int) -> Blocks:
    """Codes wider than 4 bits as 8-bit blocks. Scales and offsets come from the block headers;
    each code is the dequantised value recovered exactly: (value - offset) / scale is an integer
    to within fp32 rounding, far below 0.5."""
    b = _split(raw, n, EIGHT_BIT[name])
    offsets = None
    if name == "Q6_K":  # 16 sub-blocks of 16 values, int8 scales, fp16 d at the end
        sc = b[..., 192:208].copy().view(np.int8).astype(np.float32)
        scales = (_fp16(b, 208)[..., None] * sc).reshape(n, -1)
    elif name == "Q5_K":  # as Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins
        scales, offsets = _k_scales(b)
    elif name == "Q5_1":
        scales, offsets = _fp16(b, 0), _fp16(b, 2)
    else:
        scales = _fp16(b, 0)
    # Signed codes (q - 16 for Q5_0, ...) sit around zero point 128; offset types keep q >= 0.
    zero = 128 if offsets is None else 0
    codes = np.empty((n, scales.shape[1], t.shape[0] // scales.shape[1]), np.uint8)
    for start in range(0, n, ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        part = dataclasses.replace(t, data=t.data[rows])
        values = dequantize(part).reshape(-1, *codes.shape[1:])
        if offsets is not None:
            values -= offsets[rows, :, None]
        scale = scales[rows, :, None]
        q = np.rint(values / np.where(scale == 0, 1.0, scale)) + zero
        codes[rows] = np.where(scale == 0, 128, q).clip(0, 255)  # an all-zero block: any code
    zp = np.full(scales.shape, zero, np.uint8)
    return Blocks(8, codes, scales.astype(np.float32), zp, offsets)


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K super-block headers -> per-32-value scale d*sc and offset -dmin*m."""
    n, supers = b.shape[:2]
    d, dmin = _fp16(b, 0), _fp16(b, 2)
    packed = b[..., 4:16].astype(np.uint8)  # 8 x (6-bit scale, 6-bit min)
    sc = np.empty((n, supers, 8), np.uint8)
    mn = np.empty((n, supers, 8), np.uint8)
    sc[..., :4] = packed[..., 0:4] & 63
    mn[..., :4] = packed[..., 4:8] & 63
    sc[..., 4:] = (packed[..., 8:12] & 0x0F) | ((packed[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
    scales = (d[..., None] * sc).reshape(n, supers * 8).astype(np.float32)
    offsets = -(dmin[..., None] * mn).reshape(n, supers * 8).astype(np.float32)
    return scales, offsets


def _q4_k(b: np.ndarray) -> Blocks:
    """[N, K/256, 144] Q4_K super-blocks -> 32-value blocks (scale d*sc, offset -dmin*m)."""
    n, supers = b.shape[:2]
    scales, offsets = _k_scales(b)
    qs = b[..., 16:].reshape(n, supers, 4, 32)  # 4 chunks of 32 bytes: sub-blocks 2c and 2c+1
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, supers * 8, 32).astype(np.uint8)
    return Blocks(4, codes, scales, np.zeros(scales.shape, np.uint8), offsets)


def unpermute_rows(n_heads: int, rows: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation (adjacent-pair -> half-split rope)."""
    return np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).swapaxes(1, 2).reshape(-1)
