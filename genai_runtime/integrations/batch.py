"""Many prompts, each with its own settings, decoded together over the server's slots.

``BatchRunner.run`` keeps up to ``rows`` prompts decoding at once: a prompt is prefilled into a
free row, every step advances all active rows in one onnxruntime call (``BatchedSlots``; a model
without a share-buffer cache falls back to ``InterleavedSlots``), and a row that ends frees its
slot for the next waiting prompt. A prompt that cannot run (too long, a failed pass, a sampling
error) ends as an error result; the other rows go on. No Ray here: the Ray Data predictor wraps
this, and it runs the same without a cluster.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..batching.core import DEFAULT_MAX_CONTEXT, DecodeCore, Row, TokenHistory
from ..batching.settings import RequestSettings, check_number
from ..decoding.sampling import make_rng
from ..errors import GenerationError
from ..model import Model
from ..tokenizer import Tokenizer

FINISH_REASONS = ("stop", "length", "error")


# One prompt's settings: the one request-settings type the server uses too.
RowSettings = RequestSettings


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
class _Job:
    index: int
    settings: RowSettings
    row: Row  # the prompt, then every generated token
    start: int  # where the generated tokens begin


class BatchRunner:
    """Decodes many prompts over ``rows`` slots of one model (see the module docstring), with
    the server's decode core: its slots, token choice and stop rule."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        rows: int = 8,
        max_context: int | None = None,
        batched: bool | None = None,
    ):
        check_number("rows", rows, 1, integer=True)
        self.tokenizer = tokenizer
        self.context = min(model.spec.generation.max_length, max_context or DEFAULT_MAX_CONTEXT)
        self.vocab_size = model.vocab_size or 0
        self.core = DecodeCore(model, num_slots=rows, context=self.context, batched=batched)

    @property
    def rows(self) -> int:
        return self.core.slots.num_slots

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
        active: dict[int, _Job] = {}
        core = self.core
        while waiting or active:
            while waiting and free:
                # The lowest free row: a decode pass runs every row up to the highest in use.
                slot = min(free)
                free.remove(slot)
                i = waiting.popleft()
                s = settings[i]
                prompt = np.asarray(prompts[i], np.int64).reshape(-1)
                picker = core.picker(s.generation(), request_ops=s.ops(self.vocab_size))
                rng = None if s.greedy else make_rng(_seed(s.seed))
                row = Row(TokenHistory(prompt), picker, rng)  # type: ignore[arg-type]
                core.place(row, slot)
                try:
                    core.advance([row])  # the prompt: prefilled alone, so its failure is its own
                except Exception as exc:
                    results[i] = RowResult(error=f"the prompt could not be run: {exc}")
                    free.append(slot)
                    continue
                active[slot] = _Job(i, s, row, prompt.size)
            stepping = [job.row for job in active.values() if job.row.logits is None]
            if stepping:
                try:
                    core.advance(stepping)
                except Exception as exc:  # the rows in this pass are lost, the rest go on
                    for row in stepping:
                        job = active.pop(row.slot)
                        results[job.index] = RowResult(error=f"a decode step failed: {exc}")
                        core.slots.release(row.slot)
                        free.append(row.slot)
                    continue
            for slot, job in list(active.items()):
                try:
                    result = self._step(job)
                except Exception as exc:  # one row's bad sampling must not stop the others
                    result = RowResult(error=f"token selection failed: {exc}")
                if result is not None:
                    results[job.index] = result
                    del active[slot]
                    core.slots.release(slot)
                    free.append(slot)
        return results  # type: ignore[return-value]  # every index was filled

    def _problem(self, ids: np.ndarray, s: RowSettings) -> str | None:
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            return f"the prompt must be a non-empty 1-D list of token ids, got shape {ids.shape}"
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            return f"prompt token ids must be in [0, {self.vocab_size})"
        if s.max_tokens is not None and ids.size + s.max_tokens > self.context:
            return (
                f"the context is {self.context} tokens; the prompt has {ids.size} and "
                f"max_tokens asks for {s.max_tokens} more"
            )
        return None

    def _step(self, job: _Job) -> RowResult | None:
        """Choose the row's next token; a result once the row has ended."""
        row = job.row
        choice = self.core.choose(row)
        reason = self.core.stop_after(
            row, choice.token, generated=len(row.history) - job.start + 1,
            budget=job.settings.max_tokens, context=self.context, complete=choice.complete,
        )  # fmt: skip
        return None if reason is None else self._result(job, reason.openai)

    def _result(self, job: _Job, reason: str) -> RowResult:
        tokens = job.row.history.array()[job.start :]
        text = self.tokenizer.decode(tokens)
        return RowResult(text=text, token_ids=tuple(tokens.tolist()), finish_reason=reason)


def _seed(seed: int | None) -> int:
    return -1 if seed is None else seed % 2**63
