"""The one stop rule: whether a row ends after a token, and why.

Every decode loop asks it: the ``Generator`` (over all its rows at once), the server's and the
Engine API's loops over ``DecodeCore``, ``BatchRunner``, ``ChatSession`` and ``run``. The order
is one for all of them: end-of-sequence, a stop string, a finished grammar, a loop, the token
budget, the context. What an engine does with the answer (whether the EOS is part of the output,
when a finished grammar is reported, whether a reply that loops is cut) is its ``StopPolicy``, a
set of flags; the order never changes.
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
    LOOP = "loop"  # the reply repeats one block of tokens over and over
    BUDGET = "budget"  # the row's new-token budget is spent
    CONTEXT = "context"  # the row fills the context it may use

    @property
    def openai(self) -> str:
        """OpenAI's ``finish_reason``: a limit (a loop cut is one) is "length", else "stop"."""
        limits = (StopReason.LOOP, StopReason.BUDGET, StopReason.CONTEXT)
        return "length" if self in limits else "stop"


@dataclass(frozen=True)
class StopPolicy:
    """What an engine does with the rule's answer.

    ``eos_is_output``: the EOS that ends a row is appended to its tokens and counted (the OpenAI
    server's ``completion_tokens``, ``BatchRunner``), else never (the Engine API).
    ``grammar_ends_row``: a finished grammar ends the row at its last token; when False the row
    goes on to the EOS the grammar then forces (the Engine API's events, as the reference's).
    ``loop_span``: a reply whose last ``loop_span`` or more tokens are one block repeated at
    least ``LOOP_REPEATS`` times ends there (0: never; the command line's guard, see
    ``loop_period``).
    """

    eos_is_output: bool = True
    grammar_ends_row: bool = True
    loop_span: int = 0


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
        reply: np.ndarray | None = None,
    ) -> StopReason | None:
        """Why the row ends after ``token`` (None: it goes on). ``generated`` counts the row's
        new tokens and ``length`` all its tokens, ``token`` included; ``budget`` and ``context``
        bound them (None or 0: unbounded). ``stop_string`` feeds the token's text to the row's
        matcher and says whether a stop string completed; it is asked only for a token that is
        not EOS, so an EOS is never decoded. ``reply``: the row's new tokens so far, ``token``
        last, for the policy's loop guard."""
        if token in self.eos:
            return StopReason.EOS
        if stop_string is not None and stop_string():
            return StopReason.STOP_STRING
        if complete and self.policy.grammar_ends_row:
            return StopReason.GRAMMAR
        span = self.policy.loop_span
        if span and reply is not None and loop_period(reply, span):
            return StopReason.LOOP
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


LOOP_REPEATS = 3
LOOP_LONGEST_BLOCK = 256  # tokens: a longer block repeated is not what a stuck reply does
# the most of a reply ``loop_period`` reads: a caller may pass just this tail
LOOP_WINDOW = LOOP_REPEATS * LOOP_LONGEST_BLOCK


def loop_period(reply: np.ndarray, span: int, repeats: int = LOOP_REPEATS) -> int:
    """The length of the block ``reply`` ends by repeating, when its last ``span`` or more
    tokens (and at least ``repeats`` copies) are that block over and over; 0 when it does not.
    Only periods whose block ends with the last token again are tried, so a step costs a few
    comparisons, not one per period."""
    n = len(reply)
    longest = min(n // repeats, LOOP_LONGEST_BLOCK)
    if n < span or longest < 1:
        return 0
    last = reply[-1]
    # candidate periods: p such that the token p back equals the last one
    back = reply[n - 1 - longest : n - 1][::-1]
    for p in np.flatnonzero(back == last) + 1:
        need = max(span, repeats * int(p))
        if need > n:
            break
        tail = reply[n - need :]
        if np.array_equal(tail[int(p) :], tail[: need - int(p)]):
            return int(p)
    return 0
