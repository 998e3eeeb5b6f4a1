"""Proposers: one file per kind, each a ``ProposerSource`` (what loading leaves) that makes a
``Proposer`` per generator. ``PROPOSERS`` is the one registry, keyed like ``spec.PRODUCERS``."""

from collections.abc import Callable

from .base import Proposal, Proposer, ProposerSource
from .draft_model import DraftModelProposer, DraftModelSource
from .hidden_state import HiddenStateProposer, HiddenStateSource
from .ngram import NgramProposer, NgramSource

# producer -> load(target pipeline, speculative spec, trust) -> ProposerSource
PROPOSERS: dict[str, Callable[..., ProposerSource]] = {
    "draft_model": DraftModelSource.load,
    "ngram": NgramSource.load,
    "hidden_state": HiddenStateSource.load,
}

__all__ = [
    "PROPOSERS",
    "DraftModelProposer",
    "HiddenStateProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "ProposerSource",
]
