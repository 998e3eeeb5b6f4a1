"""Many prompts, each with its own settings, decoded together over the server's slots.

``BatchRunner.run`` keeps up to ``rows`` prompts decoding at once: a prompt is prefilled into a
free row, every step advances all active rows in one onnxruntime call (``BatchedSlots``; a model
without a share-buffer cache falls back to ``InterleavedSlots``), and a row that ends frees its
slot for the next waiting prompt. A prompt that cannot run (too long, a failed pass, a sampling
error) ends as an error result; the other rows go on. No Ray here: the Ray Data predictor wraps
this, and it runs the same without a cluster.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..batching.core import TokenHistory
from ..batching.slots import BatchedSlots, InterleavedSlots
from ..decoding.chain import make_picker
from ..decoding.picker import TokenPicker
from ..decoding.sampling import make_rng
from ..errors import GenerationError
from ..model import Model
from ..server import DEFAULT_MAX_CONTEXT
from ..spec import GenerationSpec
from ..tokenizer import Tokenizer
from ..validation import shown

FINISH_REASONS = ("stop", "length", "error")
_NO_HISTORY = np.zeros((1, 0), np.int64)


@dataclass(frozen=True)
class RowSettings:
    """How one prompt is decoded: OpenAI's meanings (temperature 0 or top_k 1 is greedy, top_k 0
    keeps the whole vocabulary, no seed draws a random one)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        _require_int("max_tokens", self.max_tokens, 1)
        _require_int("top_k", self.top_k, 0)
        if self.seed is not None:
            _require_int("seed", self.seed, None)
        for name, high in (("temperature", 2.0), ("top_p", 1.0)):
            value = getattr(self, name)
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or not 0.0 <= value <= high:
                raise GenerationError(
                    f"{name}: expected a number in [0, {high}], got {shown(value)}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _require_int(name: str, value: object, low: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise GenerationError(f"{name}: expected an integer, got {shown(value)}")
    if low is not None and value < low:
        raise GenerationError(f"{name}: expected an integer >= {low}, got {value}")


@dataclass(frozen=True)
class RowResult:
    """What one prompt produced. ``token_ids`` are every generated token, the EOS that ended the
    row included (so ``num_tokens`` counts as the server's ``completion_tokens`` does); ``text``
    leaves special tokens out. A failed row has ``finish_reason`` "error" and ``error`` says why.
    """

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str = "error"
    error: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(eq=False)
class _Row:
    index: int
    settings: RowSettings
    rng: np.random.Generator | None
    picker: TokenPicker
    history: TokenHistory  # the prompt, then every generated token
    start: int  # where the generated tokens begin
    logits: np.ndarray | None = None


class BatchRunner:
    """Decodes many prompts over ``rows`` slots of one model (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        rows: int = 8,
        max_context: int | None = None,
        batched: bool | None = None,
    ):
        _require_int("rows", rows, 1)
        self.tokenizer = tokenizer
        self.context = min(model.spec.generation.max_length, max_context or DEFAULT_MAX_CONTEXT)
        self.vocab_size = model.vocab_size or 0
        if batched is None:
            batched = BatchedSlots.supports(model) is None
        kind = BatchedSlots if batched else InterleavedSlots
        self.slots = kind(model, rows, self.context)
        self._eos = frozenset(int(t) for t in model.spec.tokens.eos)

    @property
    def rows(self) -> int:
        return self.slots.num_slots

    def run(
        self, prompts: Sequence[np.ndarray], settings: Sequence[RowSettings]
    ) -> list[RowResult]:
        """One result per prompt (token ids, 1-D), in order."""
        if len(prompts) != len(settings):
            raise GenerationError(f"{len(prompts)} prompts but {len(settings)} settings")
        results: list[RowResult | None] = [None] * len(prompts)
        waiting: deque[int] = deque()
        for i, (ids, s) in enumerate(zip(prompts, settings)):
            problem = self._problem(ids, s)
            if problem is None:
                waiting.append(i)
            else:
                results[i] = RowResult(error=problem)
        free = list(range(self.rows))
        active: dict[int, _Row] = {}
        while waiting or active:
            while waiting and free:
                # The lowest free row: a decode pass runs every row up to the highest in use.
                slot = min(free)
                free.remove(slot)
                i = waiting.popleft()
                s = settings[i]
                picker = make_picker(
                    GenerationSpec.from_openai(s.temperature, s.top_p, s.top_k),
                    eos_token_ids=sorted(self._eos),
                    vocab_size=self.vocab_size,
                )
                prompt = np.asarray(prompts[i], np.int64).reshape(-1)
                rng = None if s.greedy else make_rng(_seed(s.seed))
                row = _Row(i, s, rng, picker, TokenHistory(prompt), prompt.size)
                try:
                    row.logits = self.slots.prefill(slot, prompt, 0)
                except Exception as exc:
                    results[i] = RowResult(error=f"the prompt could not be run: {exc}")
                    free.append(slot)
                    continue
                active[slot] = row
            stepping = [slot for slot, row in active.items() if row.logits is None]
            if stepping:
                last = np.array([active[slot].history[-1] for slot in stepping], np.int64)
                try:
                    logits = self.slots.decode(stepping, last)
                except Exception as exc:  # the rows in this pass are lost, the rest go on
                    for slot in stepping:
                        row = active.pop(slot)
                        results[row.index] = RowResult(error=f"a decode step failed: {exc}")
                        self.slots.release(slot)
                        free.append(slot)
                    continue
                for slot, row_logits in zip(stepping, logits):
                    active[slot].logits = row_logits
            for slot, row in list(active.items()):
                try:
                    result = self._step(row)
                except Exception as exc:  # one row's bad sampling must not stop the others
                    result = RowResult(error=f"token selection failed: {exc}")
                if result is not None:
                    results[row.index] = result
                    del active[slot]
                    self.slots.release(slot)
                    free.append(slot)
        return results  # type: ignore[return-value]  # every index was filled

    def _problem(self, ids: np.ndarray, s: RowSettings) -> str | None:
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            return f"the prompt must be a non-empty 1-D list of token ids, got shape {ids.shape}"
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            return f"prompt token ids must be in [0, {self.vocab_size})"
        if ids.size + s.max_tokens > self.context:
            return (
                f"the context is {self.context} tokens; the prompt has {ids.size} and "
                f"max_tokens asks for {s.max_tokens} more"
            )
        return None

    def _step(self, row: _Row) -> RowResult | None:
        """Choose the row's next token; a result once the row has ended."""
        logits, row.logits = row.logits, None
        history = row.history.view() if row.picker.ops else _NO_HISTORY  # processors read it
        token = int(row.picker.pick(history, logits[None, :], row.rng)[0])
        row.history.append(token)
        if token in self._eos:
            return self._result(row, "stop")
        if len(row.history) - row.start >= row.settings.max_tokens:
            return self._result(row, "length")
        return None

    def _result(self, row: _Row, reason: str) -> RowResult:
        tokens = row.history.array()[row.start :]
        text = self.tokenizer.decode(tokens)
        return RowResult(text=text, token_ids=tuple(tokens.tolist()), finish_reason=reason)


def _seed(seed: int | None) -> int:
    return -1 if seed is None else seed % 2**63
