"""Prompt lookup: drafts copied from where the sequence's last n tokens occurred before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .base import EMPTY, Proposal

if TYPE_CHECKING:
    from ...runtime.driver import DriverSetup
    from ...runtime.executor import Executor
    from ...runtime.pipeline import LoadedPipeline
    from ..spec import SpeculativeSpec


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (n from ``ngram_size`` down to ``min_ngram_size``) and propose what followed it.

    An index of n-gram -> latest position after it is grown as the sequence grows, so a
    lookup costs O(n) per size instead of a scan of the whole context.
    """

    free = True

    def __init__(self, max_n: int = 3, min_n: int = 1, chained: bool = False):
        self.max_n, self.min_n, self.chained = max_n, min_n, chained
        self._index: list[dict[bytes, int]] = [{} for _ in range(max_n + 1)]
        self._indexed = 0  # continuation starts < this are indexed
        self._seen: np.ndarray | None = None

    def _grow(self, context: np.ndarray) -> None:
        length = context.shape[0]
        seen = self._seen
        start = self._indexed
        # A rewind or a new prompt that changed indexed tokens: start over.
        changed = seen is not None and not np.array_equal(seen[:start], context[:start])
        if start > length or changed:
            self._index = [{} for _ in range(self.max_n + 1)]
            start = 0
        data = context.astype(np.int32, copy=False)
        for i in range(max(start, 1), length):  # continuation starts at i (i < length)
            for n in range(self.min_n, min(self.max_n, i) + 1):
                self._index[n][data[i - n : i].tobytes()] = i
        self._indexed = max(length, 1) if length else 0
        self._seen = data.copy()

    def _lookup(self, context: np.ndarray, length: int, k: int) -> tuple[np.ndarray, int]:
        """The continuation of the longest match, and its n (0: none)."""
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            i = self._index[n].get(context[length - n : length].tobytes())
            if i is not None and i < length:
                return context[i : min(i + k, length)], n
        return EMPTY, 0

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        """One continuation; a token tree gets it as its rank-0 branch (``widths`` unused)."""
        context = np.ascontiguousarray(context, np.int32)
        self._grow(context)
        found, matched = self._lookup(context, context.shape[0], k)
        if self.chained and 0 < found.size < k:
            # Extend by looking up again from the context with the drafts appended.
            parts, ext = [found], np.concatenate([context, found])
            while sum(p.size for p in parts) < k:
                index_backup = self._index, self._indexed, self._seen
                self._grow(ext)
                more, _ = self._lookup(ext, ext.shape[0], k - sum(p.size for p in parts))
                self._index, self._indexed, self._seen = index_backup
                if not more.size:
                    break
                parts.append(more)
                ext = np.concatenate([ext, more])
            found = np.concatenate(parts)[:k]
        return Proposal(found.astype(np.int32), bucket=matched)

    def observe(self, num_accepted: int) -> None:
        """Stateless between rounds: the index follows the context it is given."""

    def observe_target(self, executor: Executor, row: int) -> None:
        """A lookup reads only the context."""

    def on_rewind(self, length: int) -> None:
        """The index checks the context it is given against what it indexed."""


@dataclass(frozen=True)
class NgramSource:
    """Prompt lookup needs nothing loaded."""

    @classmethod
    def load(cls, target: LoadedPipeline, spec: SpeculativeSpec, trust: bool) -> NgramSource:
        return cls()

    def make(self, spec: SpeculativeSpec, setup: DriverSetup) -> NgramProposer:
        p = spec.params  # both sizes resolved by speculative_spec
        return NgramProposer(
            p["ngram_size"], p["min_ngram_size"], bool(p.get("ngram_chained_lookup", False))
        )

    def describe(self) -> list[str]:
        return []
