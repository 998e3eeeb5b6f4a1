"""The one stop rule: whether a row ends after a token, and why.

Every decode loop asks it: the ``Generator`` (over all its rows at once), the server's and the
Engine API's loops over ``DecodeCore``, and ``BatchRunner``. The order is one for all of them:
end-of-sequence, a stop string, a finished grammar, the token budget, the context. What an engine
does with the answer (whether the EOS is part of the output, when a finished grammar is reported)
is its ``StopPolicy``, a set of flags; the order never changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np


class StopReason(str, Enum):
    EOS = "eos"
    STOP_STRING = "stop_string"
    GRAMMAR = "grammar"  # the grammar cannot go on after this token: the reply is whole
    BUDGET = "budget"  # the row's new-token budget is spent
    CONTEXT = "context"  # the row fills the context it may use

    @property
    def openai(self) -> str:
        """OpenAI's ``finish_reason``: a limit is "length", anything else "stop"."""
        return "length" if self in (StopReason.BUDGET, StopReason.CONTEXT) else "stop"


@dataclass(frozen=True)
class StopPolicy:
    """What an engine does with the rule's answer.

    ``eos_is_output``: the EOS that ends a row is appended to its tokens and counted (the OpenAI
    server's ``completion_tokens``, ``BatchRunner``), else never (the Engine API).
    ``grammar_ends_row``: a finished grammar ends the row at its last token; when False the row
    goes on to the EOS the grammar then forces (the Engine API's events, as the reference's).
    """

    eos_is_output: bool = True
    grammar_ends_row: bool = True


class StopRule:
    """The rule for one model's EOS ids under one engine's policy."""

    def __init__(
        self, eos: Iterable[int], vocab_size: int = 0, policy: StopPolicy | None = None
    ) -> None:
        ids = sorted({int(t) for t in eos if int(t) >= 0})
        self.eos = frozenset(ids)
        self.policy = policy or StopPolicy()
        # a lookup table: the Generator asks for whole rows of ids at once
        self.is_eos = np.zeros(max(vocab_size, ids[-1] + 1 if ids else 0, 1), bool)
        self.is_eos[ids] = True

    def check(
        self,
        token: int,
        *,
        generated: int,
        length: int,
        budget: int | None = None,
        context: int | None = None,
        complete: bool = False,
        stop_string: Callable[[], bool] | None = None,
    ) -> StopReason | None:
        """Why the row ends after ``token`` (None: it goes on). ``generated`` counts the row's
        new tokens and ``length`` all its tokens, ``token`` included; ``budget`` and ``context``
        bound them (None or 0: unbounded). ``stop_string`` feeds the token's text to the row's
        matcher and says whether a stop string completed; it is asked only for a token that is
        not EOS, so an EOS is never decoded."""
        if token in self.eos:
            return StopReason.EOS
        if stop_string is not None and stop_string():
            return StopReason.STOP_STRING
        if complete and self.policy.grammar_ends_row:
            return StopReason.GRAMMAR
        if budget and generated >= budget:
            return StopReason.BUDGET
        if self.fills(length, context):
            return StopReason.CONTEXT
        return None

    @staticmethod
    def fills(length: int, context: int | None) -> bool:
        """Whether ``length`` tokens fill ``context`` (None or 0: unbounded)."""
        return bool(context) and length >= context  # type: ignore[operator]

    def rows_ended(self, tokens: np.ndarray, complete: np.ndarray | None = None) -> np.ndarray:
        """Per row, whether ``tokens`` end it by the rule's first and third reasons (EOS, a
        finished grammar); the Generator has no stop strings, and its rows share one length, so it
        asks ``fills`` once per step for the context."""
        hit = self.is_eos[tokens]
        if complete is not None and self.policy.grammar_ends_row:
            hit = hit | complete
        return hit

    def on_content(self, tokens: np.ndarray, complete: np.ndarray) -> np.ndarray:
        """Per row, whether a finished grammar ends it on ``tokens`` that are content, not EOS
        (the Generator appends such a last token, unlike an EOS)."""
        return complete & ~self.is_eos[tokens]
