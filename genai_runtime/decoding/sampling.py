"""Token selection: greedy argmax and onnxruntime-genai's truncated categorical sampling.

``sampling_distribution`` builds the exact distribution the reference samples from (its
``ComputeSampledCategorical``); ``sample`` draws from it, one row at a time, with an explicit
``numpy.random.Generator``. Speculative decoding reuses ``sampling_distribution`` so the draft
and target sides agree on what "the distribution" is.

Method, as chosen by the reference from (top_k, top_p):

* ``top_k > 1``: keep the k highest logits, softmax them at ``temperature``, then, if
  ``0 < top_p < 1``, keep the shortest prefix whose cumulative probability reaches ``top_p``.
* ``top_k <= 1``: nucleus over the whole vocabulary (``FindNucleus``). For ``V <= 64`` the cut
  is exact; above that the reference stops at the first position ``i`` (in descending order)
  where ``prefix_i >= top_p * (prefix_i + (V - i - 1) * e_i)``, a bound on the unseen tail, which
  may keep a few more tokens than the exact nucleus on flat distributions. Reproduced here.
  ``top_k == 1`` lands here too (as in ``ComputeSampledCategorical``); the generator never asks,
  since ``GenerationSpec.is_greedy`` routes top_k == 1 (and temperature 0) to ``greedy``.

``min_p`` (not in the reference) then drops tokens whose probability is below
``min_p * max_prob`` (after temperature); the kept probabilities are renormalised.

Deliberate divergences from the reference's float32 arithmetic: exponentials, cumulative sums
and the renormalisation are float64; ``top_p`` is rounded to float32 first (how the reference
stores it, which decides e.g. whether 9 of 10 equal tokens reach 0.9). The kept set can differ
only when a cumulative probability lies within float32 rounding (~1e-7) of ``top_p``. Ties are
broken by the lower token id (the reference's ``partial_sort`` leaves their order unspecified).
The same seed gives other tokens than the reference (numpy's generator, not mt19937 with
``std::discrete_distribution``); the distribution is the same.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..checks import is_integer
from ..errors import GenerationError

# The reference computes the exact nucleus only at or below this vocabulary size
# (kInitialCandidateCount * kCandidateCountGrowthFactor in FindNucleus).
_EXACT_NUCLEUS_MAX_VOCAB = 64
_NUCLEUS_FIRST_CANDIDATES = 16
_NUCLEUS_GROWTH = 4
# Below this, one sort is cheaper than partitioning first.
_SORT_BELOW_VOCAB = 256


class SamplingError(GenerationError, ValueError):
    """Sampling parameters or logits that cannot define a distribution."""


def make_rng(seed: int = -1) -> np.random.Generator:
    """A generator for ``sample``; a negative seed (onnxruntime-genai's default -1) is random."""
    return np.random.default_rng(None if seed < 0 else seed)


def greedy(logits: np.ndarray) -> np.ndarray:
    """Argmax of each row of ``[B, V]`` logits as int32 ``[B]``; ties go to the lowest id."""
    return logits.argmax(axis=-1).astype(np.int32)  # the method skips np.argmax's dispatch


def _check(top_k: int, top_p: float, temperature: float, min_p: float) -> tuple[float, float]:
    if not is_integer(top_k) or top_k < 0:
        raise SamplingError(f"top_k must be an integer >= 0, got {top_k!r}")
    if not isinstance(temperature, numbers.Real) or not (
        math.isfinite(temperature) and temperature > 0
    ):
        raise SamplingError(
            f"temperature must be a finite number > 0, got {temperature!r} "
            "(temperature 0 means greedy: use greedy())"
        )
    # top_p = 0 is accepted like the reference: no cut with top_k > 1, argmax for nucleus.
    if not isinstance(top_p, numbers.Real) or not 0.0 <= top_p <= 1.0:
        raise SamplingError(f"top_p must be in [0, 1], got {top_p!r}")
    if not isinstance(min_p, numbers.Real) or not 0.0 <= min_p <= 1.0:
        raise SamplingError(f"min_p must be in [0, 1], got {min_p!r}")
    return float(np.float32(top_p)), float(temperature)


class _Scratch:
    """V-sized buffers reused across the rows of one ``sample`` call."""

    __slots__ = ("mask", "row", "values")

    def __init__(self) -> None:
        self.row: np.ndarray | None = None
        self.values: np.ndarray | None = None
        self.mask: np.ndarray | None = None

    def partitionable(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A copy of ``row`` to partition in place (made once per row) and a bool buffer."""
        if self.row is not row:
            if (
                self.values is None
                or self.values.shape != row.shape
                or self.values.dtype != row.dtype
            ):
                self.values = np.empty_like(row)
                self.mask = np.empty(row.shape, dtype=bool)
            np.copyto(self.values, row)
            self.row = row  # repartitioning any permutation of the row stays correct
        return self.values, self.mask


def _top(row: np.ndarray, k: int, scratch: _Scratch) -> np.ndarray:
    """Ids of every value >= the k-th largest, in descending order (ties: lower id first).

    The result (at least k ids) is always a prefix of the full descending order.
    """
    size = row.shape[0]
    if k >= size or size <= _SORT_BELOW_VOCAB:
        if size < 256:  # small rows: one stable argsort, no candidate bookkeeping
            return np.argsort(-row, kind="stable")
        candidates = np.arange(size)
    else:
        values, mask = scratch.partitionable(row)
        values.partition(size - k)
        np.greater_equal(row, values[size - k], out=mask)
        candidates = np.flatnonzero(mask)
    return _descending(row[candidates], candidates)


def _descending(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``ids`` ordered by ``values`` descending, ties by ascending id."""
    if values.dtype not in (np.float32, np.float16) or ids.size < 256:
        return ids[np.argsort(-values, kind="stable")]
    # A stable float sort is ~4x slower than sorting one uint64 key per token: the high word
    # is the float's bits mapped to a descending unsigned order, the low word the id.
    bits = (values.astype(np.float32) + np.float32(0.0)).view(np.uint32)  # + 0.0: -0.0 -> 0.0
    desc = np.where(bits >> 31, bits, ~(bits | np.uint32(0x80000000)))
    key = (desc.astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)
    key.sort()
    return (key & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _scaled_exp(row: np.ndarray, ids: np.ndarray, max_logit: float, inv_temp: float) -> np.ndarray:
    return np.exp((row[ids].astype(np.float64) - max_logit) * inv_temp)


def _nucleus(
    row: np.ndarray, max_logit: float, top_p: float, inv_temp: float, scratch: _Scratch
) -> tuple[np.ndarray, np.ndarray, int]:
    """The reference's ``FindNucleus``: (sorted ids, their weights, how many to keep)."""
    size = row.shape[0]
    if size <= _EXACT_NUCLEUS_MAX_VOCAB:
        ids = _top(row, size, scratch)
        weights = _scaled_exp(row, ids, max_logit, inv_temp)
        cum = weights.cumsum()
        keep = int(cum.searchsorted(top_p * cum[-1], side="left")) + 1
        return ids, weights, min(keep, size)

    # Grow the sorted candidate prefix (16, 64, 256, ...) until the tail bound says the
    # nucleus is inside it; peaked rows stop after one O(V) partition, no full sort.
    k = size if top_p >= 1.0 else min(_NUCLEUS_FIRST_CANDIDATES, size)
    while True:
        ids = _top(row, k, scratch)
        weights = _scaled_exp(row, ids, max_logit, inv_temp)
        prefix = weights.cumsum()
        tail_bound = (size - 1 - np.arange(ids.size)) * weights
        hit = np.flatnonzero(prefix >= top_p * (prefix + tail_bound))
        if hit.size:
            return ids, weights, int(hit[0]) + 1
        if ids.size >= size:
            return ids, weights, size
        k = min(k * _NUCLEUS_GROWTH, size)


def _distribution(
    row: np.ndarray,
    top_k: int,
    top_p: float,
    temperature: float,
    min_p: float,
    scratch: _Scratch,
) -> tuple[np.ndarray, np.ndarray]:
    size = row.shape[0]
    max_logit = row.max()
    if not np.isfinite(max_logit):
        raise SamplingError(f"logits row has no finite maximum (max is {max_logit})")
    max_logit = float(max_logit)
    inv_temp = 1.0 / temperature

    if top_k > 1:
        k = min(top_k, size)
        ids = _top(row, k, scratch)[:k]
        weights = _scaled_exp(row, ids, max_logit, inv_temp)
        keep = k
        if 0.0 < top_p < 1.0:
            cum = weights.cumsum()
            keep = min(int((cum / cum[-1]).searchsorted(top_p, side="left")) + 1, k)
    else:
        ids, weights, keep = _nucleus(row, max_logit, top_p, inv_temp, scratch)

    if min_p > 0.0:
        # weights are exp((x - max) / T) = prob / max_prob, descending: survivors form a prefix.
        keep = min(keep, int(np.count_nonzero(weights[:keep] >= min_p)))

    kept = weights[:keep]
    return ids[:keep].astype(np.int32), kept / kept.sum()


def sampling_distribution(
    logits_row: np.ndarray,
    *,
    top_k: int,
    top_p: float,
    temperature: float,
    min_p: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The truncated distribution ``sample`` draws from for one ``[V]`` row of logits.

    Returns ``(ids, probs)``: int32 kept token ids in descending probability order (ties: lower
    id first) and their float64 probabilities, renormalised to sum to 1.
    """
    top_p, temperature = _check(top_k, top_p, temperature, min_p)
    row = np.asarray(logits_row)
    if row.ndim != 1 or row.size == 0:
        raise SamplingError(f"expected a non-empty [V] logits row, got shape {row.shape}")
    return _distribution(row, int(top_k), top_p, temperature, float(min_p), _Scratch())


def draw(ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``(ids, probs)`` by inverse CDF on a single ``rng.random()`` draw."""
    cdf = probs.cumsum()
    j = int(cdf.searchsorted(rng.random() * cdf[-1], side="right"))
    return int(ids[min(j, ids.size - 1)])


def sample(
    logits: np.ndarray,
    *,
    top_k: int,
    top_p: float,
    temperature: float,
    min_p: float = 0.0,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw one token per row of ``[B, V]`` logits from ``sampling_distribution``; int32 ``[B]``.

    Consumes exactly one ``rng.random()`` per row, in row order, so a seed fixes the output.
    """
    top_p, temperature = _check(top_k, top_p, temperature, min_p)
    if not isinstance(rng, np.random.Generator):
        raise SamplingError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise SamplingError(f"expected [B, V] logits, got shape {logits.shape}")
    out = np.empty(logits.shape[0], dtype=np.int32)
    scratch = _Scratch()
    for b in range(logits.shape[0]):
        ids, probs = _distribution(logits[b], int(top_k), top_p, temperature, float(min_p), scratch)
        out[b] = draw(ids, probs, rng)
    return out
