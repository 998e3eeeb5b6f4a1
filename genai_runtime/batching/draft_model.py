"""A draft model for the whole batch: a smaller model of the same vocabulary proposes each row's
next tokens greedily, for every drafting row at once.

It keeps one slot per slot of the target (``BatchedSlots`` over the draft model) and the tokens
each holds. Before a round it brings every row's draft slot up to the row's history (the longest
prefix the slot already holds is kept, so a request that follows another with the same system
prompt reuses it), then runs ``k`` one-token steps for all rows in batched calls. Its drafts only
propose: the target's verify pass and each row's own picker decide what is kept, so the tokens
are the target's whatever the draft says.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..model import Model
from .slots import BatchedSlots

BATCHED_CATCH_UP = 8  # a row further behind than this prefills alone before drafting


def check_draft_model(target: Model, draft: Model) -> None:
    """A draft model must score the target's tokens: the same vocabulary and EOS ids."""
    if draft.vocab_size != target.vocab_size:
        raise ModelError(
            f"the draft model's vocabulary has {draft.vocab_size} tokens and the model's "
            f"{target.vocab_size}: a draft model must share the model's tokenizer"
        )
    ours, theirs = set(target.spec.tokens.eos), set(draft.spec.tokens.eos)
    if ours != theirs:
        raise ModelError(
            f"the draft model's EOS ids {sorted(theirs)} differ from the model's {sorted(ours)}"
        )
    why = BatchedSlots.supports(draft)
    if why is not None:
        raise ModelError(f"the draft model cannot decode a batch: {why}")


class BatchDraftModel:
    """Greedy drafts from a second model for the rows of a batch (see the module's text)."""

    def __init__(self, model: Model, num_slots: int, context: int):
        self.name = str(model.spec.model_dir or "a draft model")
        self.slots = BatchedSlots(model, num_slots, context, min_rows=1)
        self._held = np.zeros((num_slots, context), np.int64)  # the tokens each slot holds
        self._lengths = np.zeros(num_slots, np.int64)
        self.prefilled = 0  # the most tokens one row caught up by in the last round
        self.steps = 0  # the batched steps the last round ran

    def lag(self, slot: int, length: int) -> int:
        """How many tokens of a ``length``-token history the slot lacks (at least one: the
        last token always runs)."""
        return max(length - int(self._lengths[slot]), 1)

    def _keep_shared(self, slot: int, history: np.ndarray, most: int) -> int:
        """Rewind the slot to the longest prefix (at most ``most`` tokens) it shares with
        ``history``; that prefix's length."""
        n = min(int(self._lengths[slot]), most)
        differ = np.flatnonzero(self._held[slot, :n] != history[:n])
        same = int(differ[0]) if differ.size else n
        self.slots.rewind(slot, same)
        self._lengths[slot] = same
        return same

    def _run(self, slot: int, history: np.ndarray, start: int) -> np.ndarray:
        logits = self.slots.prefill(slot, history[start:], start)
        self._hold(slot, history[start:])
        return logits

    def prefill(self, slot: int, history: np.ndarray) -> None:
        """Hold all of ``history`` (a prompt, as the model prefills it): the rounds after it
        then catch up by the few tokens each pass keeps."""
        same = self._keep_shared(slot, history, history.size)
        if same < history.size:
            self._run(slot, history, same)

    def _hold(self, slot: int, tokens: np.ndarray) -> None:
        start = int(self._lengths[slot])
        self._held[slot, start : start + tokens.size] = tokens
        self._lengths[slot] = start + tokens.size

    def propose(self, rows: list[tuple[int, np.ndarray, int]]) -> list[np.ndarray]:
        """Each (slot, history, most) row's greedy drafts, ``most`` of them (at least one).

        Each row feeds the tokens of its history its slot lacks (after a pass: the drafts it
        kept and the token after them), then its own drafts, one token per batched step; rows
        end their history in the same step, so they draft in step. A row far behind (a long
        pause in drafting) prefills all but its last token first."""
        self.prefilled = 0
        behind = []  # per row: the history tokens its slot lacks
        for slot, history, _ in rows:
            same = self._keep_shared(slot, history, history.size - 1)  # the last one runs
            if history.size - same > BATCHED_CATCH_UP:
                self.prefilled = max(self.prefilled, history.size - same)
                self._run(slot, history[:-1], same)
                same = history.size - 1
            behind.append(history[same:])
        lag = max(b.size for b in behind)
        most = [m for _, _, m in rows]
        drafts = np.zeros((len(rows), max(most)), np.int64)
        self.steps = lag + max(most) - 1
        for step in range(self.steps):
            going, feed, places = [], [], []
            for i, b in enumerate(behind):
                at = step - (lag - b.size)  # this row's place in its history, then its drafts
                if 0 <= at < b.size + most[i] - 1:
                    going.append(i)
                    feed.append(b[at] if at < b.size else drafts[i, at - b.size])
                    places.append(at - b.size + 1)  # the draft its logits give, from 0
            slots = [rows[i][0] for i in going]
            tokens = np.asarray(feed, np.int64)
            logits = self.slots.decode(slots, tokens)
            self._held[slots, self._lengths[slots]] = tokens
            self._lengths[slots] += 1
            for i, place, values in zip(going, places, logits):
                if place >= 0:  # past its history: the next draft
                    drafts[i, place] = np.argmax(values)
        return [drafts[i, :m] for i, m in enumerate(most)]
