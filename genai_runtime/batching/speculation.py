"""Prompt-lookup speculation across the rows of a batched decode.

Each step, every row that may draft looks its last tokens up in its own context (n-gram prompt
lookup, ``speculative.proposers.ngram``); the batch then runs one pass of ``width`` tokens per
row (``BatchedSlots.verify``): each row's last token and up to ``width - 1`` of its drafts. The
engine picks each row's tokens from those rows one at a time with the row's own picker and keeps
going while its pick equals the next draft, so greedy, sampled and penalised rows get exactly
the tokens a plain step would give them (up to the rounding of a wider pass).

A pass of several tokens per row costs more than a one-token step, and every row pays for the
widest: ``choose_width`` weighs each row's expected kept tokens (from its recent acceptance
rate, per matched n-gram size) against the measured cost of each width at this row count, and
runs plain steps when no width beats them. Each row keeps an account of the tokens it took and
what its passes cost: no width is run that would leave any row, over its life, under 95 % of
the rate plain steps give it. When no row has drafted for a while, a two-token
probe lets the rates recover; a probe that keeps nothing doubles the wait (4 to 64 steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..speculative.adaptive import AdaptiveK
from ..speculative.proposers.ngram import NgramProposer

MAX_DRAFTS = 31  # the most drafts per row per pass (five bits, as the Engine API checks it)
OFFERED = -1  # the rate bucket of drafts a caller proposed (lookup buckets are the matched n)
DRAFTED = -2  # the rate bucket of a draft model's drafts
_PRIOR_EXTRA = 0.4  # cost of each extra token per row, as a share of a one-token step
_PRIOR_DRAFT = 0.3  # cost of a draft model's batched step, as a share of the model's own


class RowDrafts:
    """One row's lookup proposer and its acceptance rates (per matched n)."""

    def __init__(self, max_drafts: int):
        self.proposer = NgramProposer(3, 1, chained=True)
        self.rates = AdaptiveK(max_drafts, 1)

    def propose(self, context: np.ndarray, most: int) -> tuple[np.ndarray, int]:
        """Up to ``most`` drafts after ``context`` and the n they matched on (0: none)."""
        if most <= 0:
            return np.zeros(0, np.int64), 0
        proposal = self.proposer.propose(context, most)
        return proposal.tokens.astype(np.int64), proposal.bucket

    def kept(self, accepted: int, proposed: int, bucket: int) -> None:
        self.rates.update(accepted, proposed, bucket)

    def expected(self, drafts: int, bucket: int) -> float:
        """Tokens a row yields from a pass verifying ``drafts`` of its drafts (the geometric
        sum of its acceptance rate for ``bucket``)."""
        rate = self.rates.rate(bucket)
        return float(sum(rate**i for i in range(drafts + 1)))


@dataclass
class SpeculationStats:
    passes: int = 0  # verify passes (width > 1)
    plain_steps: int = 0
    proposed: int = 0  # drafts verified
    accepted: int = 0  # drafts kept
    probes: int = 0

    def as_dict(self) -> dict[str, float]:
        rate = self.accepted / self.proposed if self.proposed else 0.0
        return {**self.__dict__, "acceptance_rate": rate}


def _moving(old: float | None, new: float) -> float:
    """A moving average of timings: mostly the old, a fifth the new (the first as it is)."""
    return new if old is None else 0.8 * old + 0.2 * new


@dataclass
class WidthCosts:
    """Seconds per pass by (rows, width), as moving averages; a width not yet timed is
    estimated from the per-token extra cost seen so far."""

    seconds: dict[tuple[int, int], float] = field(default_factory=dict)

    def timed(self, rows: int, width: int, seconds: float) -> None:
        key = (rows, width)
        self.seconds[key] = _moving(self.seconds.get(key), seconds)

    def ratio(self, rows: int, width: int) -> float:
        """A pass of ``width`` tokens per row over a one-token step, at ``rows`` rows."""
        if width == 1:
            return 1.0
        plain = self.seconds.get((rows, 1))
        wide = self.seconds.get((rows, width))
        if plain and wide:
            return wide / plain
        extras = [
            (t / self.seconds[(n, 1)] - 1.0) / (w - 1)
            for (n, w), t in self.seconds.items()
            if w > 1 and (n, 1) in self.seconds
        ]
        extra = float(np.mean(extras)) if extras else _PRIOR_EXTRA
        return 1.0 + max(extra, 0.0) * (width - 1)


SLOWEST = 0.95  # a row's tokens per unit of time may fall to this share of plain steps'


@dataclass(frozen=True)
class RowOffer:
    """One row of the next pass, as the width choice sees it."""

    drafts: RowDrafts | None  # None: the row drafts nothing this step
    count: int  # drafts it has
    bucket: int
    emitted: int  # tokens the row has taken so far
    spent: float  # what the passes it ran in cost, in one-token steps

    def expected(self, width: int) -> float:
        """Tokens the row is expected to take from a pass of ``width`` tokens per row."""
        if self.drafts is None or not self.count:
            return 1.0
        return self.drafts.expected(min(self.count, width - 1), self.bucket)

    def fair(self, ratio: float, width: int) -> bool:
        """Whether a pass costing ``ratio`` one-token steps keeps the row's expected tokens
        per unit of time, over its life, at ``SLOWEST`` of plain steps' or more."""
        return self.spent + ratio <= (self.emitted + self.expected(width)) / SLOWEST


@dataclass(frozen=True)
class DraftSteps:
    """What making a pass's drafts costs besides the pass, in one-token steps (a draft model's
    steps): ``per_draft`` for each draft, ``fixed`` once (catching up on the tokens since its
    last round). Lookups cost nothing."""

    per_draft: float = 0.0
    fixed: float = 0.0

    def pass_cost(self, costs: WidthCosts, rows: int, width: int) -> float:
        return costs.ratio(rows, width) + self.per_draft * (width - 1) + self.fixed


LOOKUP = DraftSteps()


def fair_for_all(
    offers: list[RowOffer], costs: WidthCosts, width: int, drafting: DraftSteps = LOOKUP
) -> bool:
    ratio = drafting.pass_cost(costs, len(offers), width)
    return all(o.fair(ratio, width) for o in offers)


def choose_width(
    offers: list[RowOffer], costs: WidthCosts, most: int, drafting: DraftSteps = LOOKUP
) -> int:
    """The tokens per row of the next pass (1: a plain step): the width whose expected tokens
    over all rows, per unit of cost, beats a plain step by the most, among the widths that keep
    every row's own rate, over its life, at ``SLOWEST`` of plain steps' or more (a row that
    drafts nothing pays for a wide pass out of the slack plain steps leave it), counting what
    ``drafting`` costs besides the pass."""
    rows = len(offers)
    best, best_gain = 1, float(rows)
    for width in range(2, most + 2):
        if not fair_for_all(offers, costs, width, drafting):
            continue
        gain = sum(o.expected(width) for o in offers) / drafting.pass_cost(costs, rows, width)
        if gain > best_gain * 1.02:  # a margin against noise in the timings
            best, best_gain = width, gain
    return best


@dataclass
class DraftCost:
    """A draft model's seconds per batched step (a moving average), as a share of the model's
    one-token step."""

    seconds: float | None = None

    def timed(self, steps: int, seconds: float) -> None:
        self.seconds = _moving(self.seconds, seconds / steps)

    def ratio(self, costs: WidthCosts, rows: int) -> float:
        step = costs.seconds.get((rows, 1))
        return self.seconds / step if self.seconds and step else _PRIOR_DRAFT
