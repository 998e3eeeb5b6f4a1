"""Downsampling as onnxruntime-extensions' AudioDecoder does it, so features match the reference.

A 4-pole Butterworth low-pass at the target Nyquist (the recursive design of dspguide.com,
chapter 20), then windowed-sinc interpolation with a Kaiser window (beta 6) spanning
``ceil(beta / (2 * factor))`` input samples each side. Index arithmetic follows the reference's
float32 rounding; sums are float64. The low-pass runs as an FFT convolution with its impulse
response (run until it decays below 1e-13), which gives the recursion's numbers in NumPy alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GenerationError

_BETA = 6.0
_POLES = 4


def _pole_pair(p: int, fc: float) -> tuple[list[float], list[float]]:
    """Coefficients of one biquad of the low-pass prototype, moved to cutoff ``fc``."""
    angle = math.pi / (_POLES * 2.0) + (p - 1) * math.pi / _POLES
    rp, ip = -math.cos(angle), math.sin(angle)
    t = 2.0 * math.tan(0.5)
    w = 2.0 * math.pi * fc
    m = rp * rp + ip * ip
    d = 4.0 - 4.0 * rp * t + m * t * t
    x0, x1, x2 = t * t / d, 2.0 * t * t / d, t * t / d
    y1 = (8.0 - 2.0 * m * t * t) / d
    y2 = (-4.0 - 4.0 * rp * t - m * t * t) / d
    k = math.sin(0.5 - w / 2.0) / math.sin(0.5 + w / 2.0)
    d = 1.0 + y1 * k - y2 * k * k
    a = [
        (x0 - x1 * k + x2 * k * k) / d,
        (-2.0 * x0 * k + x1 + x1 * k * k - 2.0 * x2 * k) / d,
        (x0 * k * k - x1 * k + x2) / d,
    ]
    b = [0.0, (2.0 * k + y1 + y1 * k * k - 2.0 * y2 * k) / d, (-k * k - y1 * k + y2) / d]
    return a, b


def butterworth(fc: float) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) of the 4-pole low-pass at normalized cutoff ``fc``."""
    a = [0.0] * (_POLES + 3)
    b = [0.0] * (_POLES + 3)
    a[2] = b[2] = 1.0
    for p in range(1, _POLES // 2 + 1):
        ap, bp = _pole_pair(p, fc)
        ta, tb = a[:], b[:]
        for i in range(2, _POLES + 3):
            a[i] = ap[0] * ta[i] + ap[1] * ta[i - 1] + ap[2] * ta[i - 2]
            b[i] = tb[i] - bp[1] * tb[i - 1] - bp[2] * tb[i - 2]
    b[2] = 0.0
    num = np.array(a[2:], np.float64)
    den_b = -np.array(b[2:], np.float64)
    gain = num.sum() / (1.0 - den_b.sum())
    num /= gain
    den = -den_b
    den[0] = 1.0
    return num, den


def impulse_response(num: np.ndarray, den: np.ndarray, tol: float = 1e-13) -> np.ndarray:
    """The filter's impulse response, run until it has decayed below ``tol`` of its peak."""
    h: list[float] = []
    xs = [1.0, 0.0, 0.0, 0.0, 0.0]
    ys = [0.0] * 4
    quiet = 0
    while quiet < 32 and len(h) < 1 << 16:
        y = sum(num[k] * xs[k] for k in range(5)) - sum(den[k + 1] * ys[k] for k in range(4))
        h.append(y)
        xs = [0.0, *xs[:4]]
        ys = [y, *ys[:3]]
        quiet = quiet + 1 if abs(y) < tol * max(map(abs, h)) else 0
    return np.array(h, np.float64)


def _lfilter(num: np.ndarray, den: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The recursive filter as a convolution with its (decayed) impulse response, by FFT: the
    same numbers to float32 precision, without a per-sample Python loop or scipy."""
    h = impulse_response(num, den)
    size = x.size + h.size - 1
    n = 1 << (size - 1).bit_length()
    y = np.fft.irfft(np.fft.rfft(x.astype(np.float64), n) * np.fft.rfft(h, n), n)
    return y[: x.size].astype(np.float32)


def _kaiser(length: int) -> np.ndarray:
    if length == 1:
        return np.ones(1)
    x = 2.0 * np.arange(length) / (length - 1.0) - 1.0
    return np.i0(_BETA * np.sqrt(np.maximum(1.0 - x * x, 0.0))) / np.i0(_BETA)


def _interpolate(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    factor = np.float32(rate_out) / np.float32(rate_in)
    size = math.ceil(float(np.float32(x.size) * factor))
    reach = math.ceil(_BETA / (2.0 * float(factor)))
    index = np.arange(size, dtype=np.float32) / factor  # float32, as the reference
    x = x.astype(np.float64)
    base = index.astype(np.int64)
    out = np.empty(size, np.float32)
    offsets = np.arange(-reach, reach + 1)
    inner = (base - reach >= 0) & (base + reach <= x.size - 1)
    # Rows whose window fits: one [n, 2*reach+1] product.
    rows = np.nonzero(inner)[0]
    cols = base[rows, None] + offsets[None, :]
    dist = np.abs(cols.astype(np.float32) - index[rows, None]).astype(np.float64)
    out[rows] = _weighted(x, cols, dist, _kaiser(2 * reach + 1))
    for i in np.nonzero(~inner)[0]:  # the few rows at either end: shorter windows
        start, end = max(0, base[i] - reach), min(x.size - 1, base[i] + reach)
        cols = np.arange(start, end + 1)[None, :]
        dist = np.abs(cols.astype(np.float32) - index[i]).astype(np.float64)
        out[i] = _weighted(x, cols, dist, _kaiser(end - start + 1))[0]
    return out


def _weighted(x: np.ndarray, cols: np.ndarray, dist: np.ndarray, window: np.ndarray) -> np.ndarray:
    weights = np.sinc(dist)  # sin(pi d) / (pi d), 1 at d = 0
    weights *= window
    weights *= x[cols]
    return weights.sum(axis=1)


def resample(pcm: np.ndarray, rate_in: int, rate_out: int, name: str = "audio") -> np.ndarray:
    """Mono float32 PCM from ``rate_in`` to ``rate_out`` (downsampling only, as the reference)."""
    if rate_in == rate_out:
        return np.ascontiguousarray(pcm, np.float32)
    if rate_in < rate_out:
        raise GenerationError(
            f"{name}: sample rate {rate_in} Hz is below the model's {rate_out} Hz; only "
            "downsampling is supported"
        )
    num, den = butterworth(0.5 * rate_out / rate_in)
    return _interpolate(_lfilter(num, den, pcm), rate_in, rate_out)
