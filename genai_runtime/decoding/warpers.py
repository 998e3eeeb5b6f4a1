"""Distribution-shaping ops of the v2 chain and its two terminals, pure NumPy over ``[B, V]``.

Each shaping op is a ``(tokens, logits) -> logits`` callable like a processor: it rescales or
masks (with the lowest float32, as the processors do) each row independently, in place. Unlike
the reference's fused sampler (``decoding.sampling``, used for v1 configs), these compose in the
order written: ``top_k`` then ``temperature`` differs from ``temperature`` then ``top_p``.

Ties are broken towards the lower token id everywhere (kept first, cut last). Probabilities are
float64 softmaxes of the current row. ``keeps_argmax`` marks ops that never remove nor demote the
row's argmax, so a chain ending in ``argmax`` can skip a trailing run of them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..checks import is_integer, is_number
from ..errors import ConfigError
from .processors import LOWEST
from .sampling import SamplingError, _Scratch, _top


def _number(name: str, value: Any, low: float, high: float, *, open_low: bool) -> float:
    if not is_number(value):
        raise ConfigError.at(name, f"expected a number, got {value!r}")
    value = float(value)
    below = value <= low if open_low else value < low
    if math.isnan(value) or below or value > high:
        interval = f"{'(' if open_low else '['}{low}, {high}]"
        raise ConfigError.at(name, f"must be in {interval}, got {value}")
    return value


def _mask_except(row: np.ndarray, keep: np.ndarray) -> None:
    """Set every entry of ``row`` to LOWEST except the ids in ``keep``."""
    kept = row[keep]
    row.fill(LOWEST)
    row[keep] = kept


def _probs(row: np.ndarray) -> np.ndarray:
    weights = np.exp(row.astype(np.float64) - float(row.max()))
    return weights / weights.sum()


class Temperature:
    """Divide the logits by ``temperature`` (> 0; 0 is not a temperature: use ``argmax``)."""

    keeps_argmax = True

    def __init__(self, temperature: float):
        self.temperature = _number("temperature", temperature, 0.0, math.inf, open_low=True)
        if math.isinf(self.temperature):
            raise ConfigError.at("temperature", "must be finite, got inf")
        self._t = np.float32(self.temperature)

    @property
    def active(self) -> bool:
        return self._t != np.float32(1.0)

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            np.divide(logits, self._t, out=logits)
        return logits

    def __repr__(self) -> str:
        return f"temperature({self.temperature:g})"


class TopK:
    """Keep the ``k`` highest logits of each row (ties: lower ids first)."""

    keeps_argmax = True

    def __init__(self, k: int):
        if not is_integer(k) or k < 1:
            raise ConfigError.at("k", f"expected an integer >= 1, got {k!r}")
        self.k = int(k)

    @property
    def active(self) -> bool:
        return True

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        vocab = logits.shape[1]
        if self.k >= vocab:
            return logits
        for row in logits:
            # The k-th largest value; everything above it stays, ties at it fill up by id.
            threshold = np.partition(row, vocab - self.k)[vocab - self.k]
            above = np.flatnonzero(row > threshold)
            ties = np.flatnonzero(row == threshold)[: self.k - above.size]
            _mask_except(row, np.concatenate([above, ties]))
        return logits

    def __repr__(self) -> str:
        return f"top_k({self.k})"


class TopP:
    """Nucleus: keep the shortest prefix (descending probability) whose mass reaches ``p``."""

    keeps_argmax = True

    def __init__(self, p: float):
        self.p = _number("p", p, 0.0, 1.0, open_low=True)

    @property
    def active(self) -> bool:
        return self.p < 1.0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        scratch = _Scratch()
        for row in logits:
            probs = _probs(row)
            # Sort only a growing head (64, 256, ...) until its mass reaches p: peaked rows
            # cost one partition, not a full sort of the vocabulary.
            k = 64
            while True:
                order = _top(row, min(k, row.size), scratch)
                cum = probs[order].cumsum()
                if cum[-1] >= self.p or order.size >= row.size:
                    break
                k *= 4
            keep = min(int(cum.searchsorted(self.p, side="left")) + 1, order.size)
            _mask_except(row, order[:keep])
        return logits

    def __repr__(self) -> str:
        return f"top_p({self.p:g})"


class MinP:
    """Drop tokens whose probability is below ``p`` times the row's highest probability."""

    keeps_argmax = True

    def __init__(self, p: float):
        self.p = _number("p", p, 0.0, 1.0, open_low=False)

    @property
    def active(self) -> bool:
        return self.p > 0.0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        for row in logits:
            relative = np.exp(row.astype(np.float64) - float(row.max()))  # prob / max prob
            row[relative < self.p] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"min_p({self.p:g})"


class TypicalP:
    """Locally typical sampling (Meister et al. 2022): keep the tokens whose surprisal is closest
    to the row's entropy, in that order, until their mass reaches ``p`` (at least one token).

    It may drop the argmax (a very likely token is atypical in a flat row), so it is never
    skipped before ``argmax``.
    """

    keeps_argmax = False

    def __init__(self, p: float):
        self.p = _number("p", p, 0.0, 1.0, open_low=True)

    @property
    def active(self) -> bool:
        return self.p < 1.0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        for row in logits:
            probs = _probs(row)
            with np.errstate(divide="ignore"):
                surprisal = -np.log(probs)
            entropy = float(np.sum(probs * np.where(probs > 0, surprisal, 0.0)))
            distance = np.abs(surprisal - entropy)
            order = np.argsort(distance, kind="stable")  # ties: lower id first
            cum = probs[order].cumsum()
            keep = min(int(np.count_nonzero(cum < self.p)) + 1, row.size)
            _mask_except(row, order[:keep])
        return logits

    def __repr__(self) -> str:
        return f"typical_p({self.p:g})"


# --- terminals: [B, V] logits -> int32 [B] tokens --------------------------------------------


class Argmax:
    """The highest logit of each row; ties go to the lowest id."""

    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.argmax(logits, axis=1).astype(np.int32)

    def __repr__(self) -> str:
        return "argmax"


class Sample:
    """One draw per row from the softmax of the chain's output, by inverse CDF.

    Consumes exactly one ``rng.random()`` per row, in row order. Masked (LOWEST) entries have
    probability exactly 0 and are never drawn.
    """

    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(logits.shape[0], dtype=np.int32)
        for b, row in enumerate(logits):
            top = float(row.max())
            if not math.isfinite(top):
                raise SamplingError(f"logits row {b} has no finite maximum (max is {top})")
            cdf = np.exp(row.astype(np.float64) - top).cumsum()
            j = int(cdf.searchsorted(rng.random() * cdf[-1], side="right"))
            out[b] = min(j, row.size - 1)
        return out

    def __repr__(self) -> str:
        return "sample"
