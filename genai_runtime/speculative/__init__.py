"""Speculative decoding, its own floor above ``runtime/`` and ``decoding/``: the checked
strategy (``spec``), adaptive K, one file per proposer behind a ``Proposer`` protocol
(``proposers/``), token-tree planning (``tree``), loading against the target (``loading``) and
the round-based driver (``driver``). Acceptance stays a pure function in
``decoding.acceptance``."""

from .adaptive import AdaptiveK
from .loading import SpeculativeModel, load_speculative
from .tree import tree_note

__all__ = ["AdaptiveK", "SpeculativeModel", "load_speculative", "tree_note"]
