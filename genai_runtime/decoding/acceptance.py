"""Speculative acceptance, one pure function: which drafted tokens a target keeps.

Greedy acceptance is exact match against the target's argmax. Rejection sampling keeps the
target's sampling distribution exactly: accept a draft x with probability min(1, p(x)/q(x)),
else resample from norm(max(0, p - q)); n-gram drafts are point masses (q = 1 at x).
"""

from __future__ import annotations

import numpy as np

from .sampling import draw


def accept(
    draft: np.ndarray,
    draft_probs: np.ndarray | None,
    target: np.ndarray,
    rng: np.random.Generator | None,
) -> tuple[int, int]:
    """How many of ``draft`` [k] to keep, and the token that follows them.

    ``target`` [k + 1, V] holds the target's next-token scores after each draft prefix. With
    ``rng`` None it is greedy: the longest prefix equal to the target's argmax, then the argmax
    at the first mismatch (or after the last draft). Otherwise ``target`` holds probabilities
    and ``draft_probs`` [k, V] the distributions the drafts were sampled from (None: point
    masses); rejection sampling then returns a token distributed exactly as the target's.
    """
    k = int(draft.shape[0])
    if target.shape[0] != k + 1:
        raise ValueError(f"target has {target.shape[0]} rows for {k} drafts (expected {k + 1})")
    if rng is None:
        choice = np.argmax(target, axis=-1)
        miss = np.flatnonzero(choice[:k] != draft)
        n = int(miss[0]) if miss.size else k
        return n, int(choice[n])
    for i in range(k):
        x = int(draft[i])
        p = target[i]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if q_x > 0.0 and rng.random() * q_x < p[x]:  # u < p/q without dividing
            continue
        residual = p.copy()
        if draft_probs is None:
            residual[x] = 0.0
        else:
            np.subtract(residual, draft_probs[i], out=residual)
            np.maximum(residual, 0.0, out=residual)
        total = residual.sum()
        if total <= 0.0:  # p == q up to rounding: p itself is the residual's limit
            residual, total = p, p.sum()
        return i, _draw_dense(residual / total, rng)
    return k, _draw_dense(target[k], rng)


def _draw_dense(probs: np.ndarray, rng: np.random.Generator) -> int:
    ids = np.flatnonzero(probs)
    return draw(ids, probs[ids], rng)
