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
_FILTER_BLOCK = 1 << 16  # input samples per FFT of the low-pass
_ROWS = 1 << 14  # output samples per interpolation product


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
    peak = 0.0
    while quiet < 32 and len(h) < 1 << 16:
        y = sum(num[k] * xs[k] for k in range(5)) - sum(den[k + 1] * ys[k] for k in range(4))
        h.append(y)
        xs = [0.0, *xs[:4]]
        ys = [y, *ys[:3]]
        peak = max(peak, abs(y))
        quiet = quiet + 1 if abs(y) < tol * peak else 0
    return np.array(h, np.float64)


def _kaiser(length: int) -> np.ndarray:
    if length == 1:
        return np.ones(1)
    x = 2.0 * np.arange(length) / (length - 1.0) - 1.0
    return np.i0(_BETA * np.sqrt(np.maximum(1.0 - x * x, 0.0))) / np.i0(_BETA)


def _weighted(x: np.ndarray, cols: np.ndarray, dist: np.ndarray, window: np.ndarray) -> np.ndarray:
    weights = np.sinc(dist)  # sin(pi d) / (pi d), 1 at d = 0
    weights *= window
    weights *= x[cols]
    return weights.sum(axis=1)


class Resampler:
    """``resample`` as a stream: ``push`` blocks of PCM, then ``finish`` once; the outputs,
    joined, equal ``resample`` of the whole input. Memory is one block plus the filter's and
    the window's reach, whatever the duration.

    The low-pass runs as overlap-add FFT convolution with its impulse response; an output
    sample is computed once every input sample its window reaches has been filtered.
    """

    def __init__(self, rate_in: int, rate_out: int, name: str = "audio"):
        if rate_in < rate_out:
            raise GenerationError(
                f"{name}: sample rate {rate_in} Hz is below the model's {rate_out} Hz; only "
                "downsampling is supported"
            )
        self.identity = rate_in == rate_out
        self._factor = np.float32(rate_out) / np.float32(rate_in)  # float32, as the reference
        self._reach = math.ceil(_BETA / (2.0 * float(self._factor)))
        self._window = _kaiser(2 * self._reach + 1)
        self._offsets = np.arange(-self._reach, self._reach + 1)
        # sin(pi |o - f|) = sign(o) * sin(pi f) for 0 <= f < 1: (-1)^o left of 0, -(-1)^o right.
        parity = np.where(self._offsets % 2 == 0, 1.0, -1.0)
        self._signed_window = np.where(self._offsets <= 0, parity, -parity) * self._window
        h = (
            np.ones(1)
            if self.identity
            else impulse_response(*butterworth(0.5 * rate_out / rate_in))
        )
        self._fft_size = 1 << (_FILTER_BLOCK + h.size - 2).bit_length()
        self._h_fft = np.fft.rfft(h, self._fft_size)
        self._carry = np.zeros(h.size - 1)  # what earlier blocks add to the next outputs
        self._filtered = np.empty(0, np.float64)  # filtered input from index ``_origin`` on
        self._origin = 0
        self._count_in = 0
        self._next_out = 0

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """The resampled samples that ``pcm`` (the next input samples) completes."""
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        self._count_in += pcm.size
        if self.identity:
            return pcm.copy()
        if pcm.size:
            parts = [
                self._filter(pcm[i : i + _FILTER_BLOCK]) for i in range(0, pcm.size, _FILTER_BLOCK)
            ]
            self._filtered = np.concatenate([self._filtered, *parts])
        return self._emit(self._last_complete())

    def finish(self) -> np.ndarray:
        """The last samples, whose windows the end of the input cuts short."""
        if self.identity:
            return np.empty(0, np.float32)
        return self._emit(math.ceil(float(np.float32(self._count_in) * self._factor)))

    def _filter(self, block: np.ndarray) -> np.ndarray:
        """Overlap-add: the block's convolution plus what earlier blocks carried into it."""
        n = block.size
        spectrum = np.fft.rfft(block.astype(np.float64), self._fft_size) * self._h_fft
        full = np.fft.irfft(spectrum, self._fft_size)[: n + self._carry.size]
        full[: self._carry.size] += self._carry
        self._carry = full[n:].copy()
        # Rounded to float32 like the reference's filter output, then read back as double.
        return full[:n].astype(np.float32).astype(np.float64)

    def _index(self, rows: np.ndarray) -> np.ndarray:
        return rows.astype(np.float32) / self._factor  # float32, as the reference

    def _last_complete(self) -> int:
        """One past the last output whose window ends inside the input filtered so far."""
        limit = self._count_in - 1 - self._reach
        if limit < 0:
            return self._next_out
        top = max(self._next_out, math.ceil((limit + 1) * float(self._factor)) + 2)
        rows = np.arange(self._next_out, top)
        return self._next_out + int(
            np.searchsorted(self._index(rows).astype(np.int64), limit, "right")
        )

    def _emit(self, stop: int) -> np.ndarray:
        out = [np.empty(0, np.float32)]
        for first in range(self._next_out, stop, _ROWS):
            out.append(self._rows(np.arange(first, min(stop, first + _ROWS))))
        self._next_out = max(self._next_out, stop)
        keep = max(0, int(self._index(np.array([self._next_out]))[0]) - self._reach)
        if keep > self._origin:
            self._filtered = self._filtered[keep - self._origin :]
            self._origin = keep
        return np.concatenate(out)

    def _inner(self, x: np.ndarray, base: np.ndarray, frac: np.ndarray) -> np.ndarray:
        """Rows whose whole window lies in the input: one [n, 2*reach+1] product.

        The reference's float32 distance ``j - index`` is exact here, so it is ``|o - frac|``
        for offset ``o`` (frac = index - base); sin(pi * that) is +-sin(pi * frac), one sine per
        row. A row on an input sample (frac 0) is that sample: every other sinc weight is 0.
        """
        dist = np.abs(self._offsets[None, :] - frac[:, None])
        dist *= np.pi
        on_sample = frac == 0.0
        dist[on_sample] = 1.0  # keep the division finite; those rows are replaced below
        weights = np.divide(self._signed_window, dist, out=dist)
        weights *= x[base[:, None] + self._offsets[None, :] - self._origin]
        out = weights.sum(axis=1) * np.sin(np.pi * frac)
        out[on_sample] = x[base[on_sample] - self._origin]
        return out

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        x, reach, last = self._filtered, self._reach, self._count_in - 1
        index = self._index(rows)
        base = index.astype(np.int64)
        out = np.empty(rows.size, np.float32)
        inner = (base - reach >= 0) & (base + reach <= last)
        sel = np.nonzero(inner)[0]
        out[sel] = self._inner(x, base[sel], index[sel].astype(np.float64) - base[sel])
        for i in np.nonzero(~inner)[0]:  # the few rows at either end: shorter windows
            start, end = max(0, base[i] - reach), min(last, base[i] + reach)
            cols = np.arange(start, end + 1)[None, :]
            dist = np.abs(cols.astype(np.float32) - index[i]).astype(np.float64)
            out[i] = _weighted(x, cols - self._origin, dist, _kaiser(end - start + 1))[0]
        return out


def resample(pcm: np.ndarray, rate_in: int, rate_out: int, name: str = "audio") -> np.ndarray:
    """Mono float32 PCM from ``rate_in`` to ``rate_out`` (downsampling only, as the reference)."""
    stream = Resampler(rate_in, rate_out, name)
    head = stream.push(pcm)
    return np.concatenate([head, stream.finish()])
