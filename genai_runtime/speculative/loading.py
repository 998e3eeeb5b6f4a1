"""Checking a speculative strategy against the target's graphs and loading what its proposer
needs; every error here is raised at load time, before any generator exists."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..runtime.driver import DriverSetup
from ..runtime.pipeline import LoadedPipeline
from .driver import SpeculativeDriver
from .proposers import PROPOSERS, ProposerSource
from .spec import SpeculativeSpec, speculative_spec
from .target import check_target
from .tree import tree_plan


@dataclass(frozen=True)
class SpeculativeModel:
    """What a Model holds for speculative decoding: the checked spec and its proposer's source
    (a draft model's sessions, a head's session, nothing for a lookup)."""

    spec: SpeculativeSpec
    source: ProposerSource

    def make_driver(self, setup: DriverSetup) -> SpeculativeDriver:
        """The driver a new generator decodes with (``Model.driver_factory``)."""
        return SpeculativeDriver(self.spec, self.source, setup)

    def describe(self) -> list[str]:
        s = self.spec
        lines = [
            f"proposer {s.producer}"
            + (f" (session {s.draft_session!r})" if s.draft_session else "")
            + f", up to {s.num_speculative_tokens} tokens per round"
            + (f", adaptive K >= {s.min_k}" if s.adaptive else ", fixed K"),
            f"acceptance {s.acceptance} (auto: greedy match for greedy search, "
            "rejection sampling otherwise)",
            *self.source.describe(),
        ]
        if s.tree_note:
            lines.append(s.tree_note)
        return lines


def load_speculative(target: LoadedPipeline, *, trust: bool = False) -> SpeculativeModel | None:
    """None unless the target's config asks for speculative decoding."""
    spec = target.spec
    if spec.strategy.kind != "speculative":
        return None
    sspec = speculative_spec(spec)
    check_target(spec, target.plan)
    if sspec.tree:
        tree, depth, note = tree_plan(target, sspec.tree, sspec.num_speculative_tokens)
        sspec = dataclasses.replace(
            sspec, num_speculative_tokens=depth, tree_note=note, token_tree=tree
        )
    return SpeculativeModel(sspec, PROPOSERS[sspec.producer](target, sspec, trust))
