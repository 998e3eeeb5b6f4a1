"""``TokenPicker``: the processor chain, then one terminal (argmax, the reference's fused sampler,
or a v2 chain's ``sample``) — the single path every caller chooses next tokens through."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..spec import GenerationSpec
from .guidance import Grammar
from .processors import Processor
from .sampling import greedy, sample, sampling_distribution
from .warpers import Argmax


class ReferenceSample:
    """onnxruntime-genai's fused sampler (top-k / nucleus at a temperature, then min-p)."""

    def __init__(self, generation: GenerationSpec):
        self.top_k = generation.top_k
        self.top_p = generation.top_p
        self.temperature = generation.temperature
        self.min_p = generation.min_p

    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return sample(
            logits, top_k=self.top_k, top_p=self.top_p, temperature=self.temperature,
            min_p=self.min_p, rng=rng,
        )  # fmt: skip

    def distribution(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The truncated distribution one row is drawn from (``sampling_distribution``)."""
        return sampling_distribution(
            row, top_k=self.top_k, top_p=self.top_p, temperature=self.temperature,
            min_p=self.min_p,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"sample(top_k={self.top_k}, top_p={self.top_p:g}, "
            f"temperature={self.temperature:g}, min_p={self.min_p:g}) [reference fused sampler]"
        )


class ReferenceGreedy:
    def __call__(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return greedy(logits)

    def distribution(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A point mass on the argmax."""
        return np.array([int(np.argmax(row))], np.int32), np.ones(1)

    def __repr__(self) -> str:
        return "argmax"


class TokenPicker:
    """The one way a next token is chosen: ``ops`` (processors, grammar) then ``terminal``
    (argmax or a sampler). ``pick(tokens, logits, rng) -> int32 [B]``.

    The Generator's step, the speculative driver and the server engine all choose through one.
    Speculative verification takes the two halves apart: ``process`` (the ops on a row scored
    by a wide pass) and ``distribution`` (what the terminal would draw from it), so rejection
    sampling keeps exactly the distribution a plain step samples from.

    ``logits`` is modified in place (callers pass a buffer they own). Per-sequence state (the
    grammar, new-token counts) lives here, so build one picker per generator / request.
    """

    def __init__(
        self,
        ops: Sequence[Processor],
        terminal: Callable[[np.ndarray, np.random.Generator], np.ndarray],
        *,
        skipped: Sequence[Processor] = (),
        implicit_terminal: bool = False,
        reference_order: bool = False,
    ):
        self.ops: tuple[Processor, ...] = tuple(ops)
        self.terminal = terminal
        self.skipped = tuple(skipped)
        self.implicit_terminal = implicit_terminal
        self.reference_order = reference_order
        self.grammar: Grammar | None = next((o for o in self.ops if isinstance(o, Grammar)), None)
        # Greedy with the grammar last: mask only rows whose argmax the grammar bans.
        self._grammar_argmax = (
            self.grammar is not None
            and self.ops[-1] is self.grammar
            and isinstance(terminal, (Argmax, ReferenceGreedy))
        )
        self._starts = [o for o in self.ops if hasattr(o, "start")]
        self._prompt_end = 0

    @property
    def is_greedy(self) -> bool:
        return isinstance(self.terminal, (Argmax, ReferenceGreedy))

    @property
    def argmax_only(self) -> bool:
        """Greedy with no op before it: the next token is the logits' argmax, which a device
        can take where the logits are (only the ids cross to the host)."""
        return not self.ops and self.is_greedy

    @property
    def device_top_k(self) -> int | None:
        """The k of top-k sampling with no op before it (None otherwise): the draw depends on
        each row's k highest logits alone, which a device can take where the logits are."""
        terminal = self.terminal
        if self.ops or not isinstance(terminal, ReferenceSample) or terminal.top_k <= 1:
            return None
        return int(terminal.top_k)

    def pick_top_k(
        self, values: np.ndarray, ids: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Tokens ``int32 [B]`` drawn from each row's top-k candidates (``values`` highest
        first, equal values lower id first, and their ``ids``, both ``[B, k]``): the draw
        ``pick`` makes from the whole row, one ``rng`` draw per row."""
        positions = self.terminal(values, rng)
        return ids[np.arange(ids.shape[0]), positions].astype(np.int32)

    def pick(self, tokens: np.ndarray, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Tokens ``int32 [B]`` for ``logits [B, V]`` after the sequences ``tokens [B, T]``."""
        if self._grammar_argmax:
            for op in self.ops[:-1]:
                logits = op(tokens, logits)
            return self.grammar.argmax(logits)
        return self.terminal(self.process(tokens, logits), rng)

    def process(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The ops alone: what the terminal sees for ``logits [B, V]``."""
        for op in self.ops:
            logits = op(tokens, logits)
        return logits

    def choose(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The terminal alone, on logits ``process`` returned."""
        return self.terminal(logits, rng)

    def distribution(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, probs)`` the terminal draws one processed ``[V]`` row from (a point mass for
        argmax). Only the reference order's terminals define it (``verify_obstacle``)."""
        return self.terminal.distribution(row)

    def verify_obstacle(self) -> str | None:
        """Why a speculative driver cannot verify drafts with this picker (None: it can)."""
        if self.grammar is not None or not self.reference_order:
            return (
                "speculative decoding verifies with the search options' chain; an explicit "
                "generation.logits chain or a grammar is not supported with it yet"
            )
        return None

    # -- per-sequence hooks ----------------------------------------------------------------------

    def start(self, prompt_length: int) -> None:
        """A prompt now ends at ``prompt_length``: new-token counts and the grammar restart."""
        self._prompt_end = prompt_length
        for op in self._starts:
            op.start(prompt_length)
        if self.grammar is not None and self.grammar.consumed:
            self.grammar.restart()

    def commit(self, tokens: np.ndarray, ended: np.ndarray | None = None) -> np.ndarray | None:
        """Feed the chosen tokens to the grammar (skipping ``ended`` rows); rows it completed
        are True (None: no grammar)."""
        return None if self.grammar is None else self.grammar.commit(tokens, ended)

    def rewind(self, sequence: np.ndarray) -> None:
        """The sequence was cut to ``sequence`` ``[B, T]``: replay the generated part kept."""
        length = sequence.shape[1]
        if length < self._prompt_end:
            self.start(length)
        elif self.grammar is not None:
            self.grammar.restart(sequence[:, self._prompt_end :])

    def describe(self) -> list[str]:
        """The chain as it will run, one entry per link, terminal last."""
        links = [repr(op) for op in self.ops]
        terminal = repr(self.terminal)
        if self.implicit_terminal:
            terminal += " (implicit)"
        links.append(terminal)
        if self.skipped:
            links.append("skipped before argmax: " + ", ".join(repr(op) for op in self.skipped))
        return links
