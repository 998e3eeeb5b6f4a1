"""The contract between a generator and a driver that produces tokens in rounds.

Plain decoding is the generator's own one-token step. A driver (speculative decoding, a
controller plugin) instead runs rounds: each gets a ``DecodeState`` — the sequence, how much of
it is committed, the logits the generator already holds, the target's executor, the token picker
and the random generator — and returns the tokens it decided. The generator alone emits them,
one per ``generate_next_token``, so EOS, max_length and "done" are decided in one place and no
driver touches the generator's fields. mlx-lm's ``speculative_generate_step`` yields tokens and
``stream_generate`` keeps the books the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import GenaiRuntimeError, ModelError

if TYPE_CHECKING:
    from ..decoding.picker import TokenPicker
    from ..decoding.stopping import StopRule
    from .executor import Executor, TreePass


@dataclass
class DecodeState:
    """What one round sees (batch 1). ``tokens[:length]`` is committed; ``tokens[length:]``
    is scratch the round may write candidates into (so the picker's history includes them).
    The executor holds ``executor.length <= length`` tokens; the rest are pending, unrun."""

    tokens: np.ndarray  # int32 [max_length], the generator's row
    length: int
    logits: np.ndarray | None  # [V] next-token logits after ``length`` tokens, if computed
    executor: Executor
    picker: TokenPicker
    rng: np.random.Generator
    stop: StopRule  # the one stop rule: which ids end the sequence

    @property
    def max_length(self) -> int:
        return self.tokens.shape[0]


class Driver(Protocol):
    def round(self, state: DecodeState) -> list[int]:
        """One round: at least one token after ``state.length``, in order. The executor may
        have run past the committed sequence; the generator rewinds what it does not keep."""
        ...

    def on_rewind(self, length: int) -> None:
        """The target's cache went back to ``length`` tokens outside a round."""
        ...

    def stats(self) -> dict[str, float] | None:
        """Counters for ``Generator.get_speculative_stats`` (None: not speculative)."""
        ...


@dataclass(frozen=True)
class DriverSetup:
    """What a driver is built from, once per generator."""

    executor: Executor
    picker: TokenPicker
    rng: np.random.Generator
    batch_size: int
    max_length: int
    vocab_size: int


# A model's way to make the driver for a new generator (None on the model: plain decoding).
DriverFactory = Callable[[DriverSetup], Driver]


def forward_rows(
    executor: Executor,
    tokens: np.ndarray,
    tree: TreePass | None = None,
    *,
    what: str = "model",
    last_only: bool = False,
) -> np.ndarray:
    """Run ``tokens [n]`` (batch 1) after what ``executor`` holds; logits ``[n, V]`` after each
    (``last_only``: ``[V]`` after the last), a view the next pass overwrites. A failed pass
    leaves the executor as it was."""
    start = executor.length
    try:
        # every row's logits are read: a graph with the last-position switch is asked for them
        # all at once (else ``pass_logits`` would run the pass a second time)
        last = executor.forward(tokens[None, :], tree, every_row=not last_only)
    except Exception as exc:
        executor.rewind_to(start)
        if isinstance(exc, GenaiRuntimeError):
            raise
        raise ModelError(f"{what} run failed: {exc}") from exc
    return last[0] if last_only else executor.pass_logits()[0]
