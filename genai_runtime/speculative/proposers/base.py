"""What every proposer shares: the ``Proposal`` it returns and the ``Proposer`` protocol the
speculative driver calls, with no branch on which kind it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ...runtime.driver import DriverSetup
    from ...runtime.executor import Executor
    from ..spec import SpeculativeSpec

EMPTY = np.zeros(0, np.int32)


@dataclass
class Proposal:
    tokens: np.ndarray  # int32 [k]
    probs: np.ndarray | None = None  # [k, V] draft distributions; None: point masses
    bucket: int = 0  # how sure the proposer is (n-gram: the matched n); AdaptiveK keys on it
    # token trees: ranked candidates per depth along ``tokens`` (None: ``tokens`` alone)
    candidates: list[np.ndarray] | None = None


class Proposer(Protocol):
    # Proposing costs nothing (a lookup): the driver proposes at full width first, then sizes
    # K by how sure the proposal is. Otherwise (a model run per token) K is sized first.
    free: bool

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        """Up to ``k`` drafts after ``context``; ``widths``: rank that many candidates per depth
        (a token tree)."""
        ...

    def observe(self, num_accepted: int) -> None:
        """How many of the last proposal's drafts the target kept."""
        ...

    def observe_target(self, executor: Executor, row: int) -> None:
        """The target's verify pass just ran; ``row`` is the pass row of the last kept token
        (-1: none ran)."""
        ...

    def on_rewind(self, length: int) -> None:
        """The target's cache went back to ``length`` tokens outside a round."""
        ...


class ProposerSource(Protocol):
    """What loading leaves for one producer kind (a draft model's sessions, a head's session,
    nothing for a lookup); builds a fresh proposer per generator."""

    def make(self, spec: SpeculativeSpec, setup: DriverSetup) -> Proposer: ...

    def describe(self) -> list[str]: ...


def ranked(row: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` highest-scoring ids of ``row``, best first."""
    if width <= 1:
        return np.array([int(np.argmax(row))], np.int32)
    top = np.argpartition(-row, width - 1)[:width]
    return top[np.argsort(-row[top], kind="stable")].astype(np.int32)
