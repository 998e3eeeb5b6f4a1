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

    def _catch_up(self, slot: int, history: np.ndarray) -> np.ndarray | None:
        """Bring the slot to ``history``; its next-token logits when that took a prefill, None
        when one token is left for the batched step (the slot then holds all but the last)."""
        n = min(int(self._lengths[slot]), history.size - 1)  # the last token always runs
        differ = np.flatnonzero(self._held[slot, :n] != history[:n])
        same = int(differ[0]) if differ.size else n
        self.slots.rewind(slot, same)
        self._lengths[slot] = same
        if history.size - same == 1:
            return None
        self.prefilled = max(self.prefilled, history.size - same)
        logits = self.slots.prefill(slot, history[same:], same)
        self._hold(slot, history[same:])
        return logits

    def _hold(self, slot: int, tokens: np.ndarray) -> None:
        start = int(self._lengths[slot])
        self._held[slot, start : start + tokens.size] = tokens
        self._lengths[slot] = start + tokens.size

    def propose(self, rows: list[tuple[int, np.ndarray, int]]) -> list[np.ndarray]:
        """Each (slot, history, most) row's greedy drafts, ``most`` of them (at least one)."""
        drafts = np.zeros((len(rows), max(most for _, _, most in rows)), np.int64)
        stepping = []  # rows whose last token runs in the batched step
        self.prefilled = 0
        for i, (slot, history, _) in enumerate(rows):
            logits = self._catch_up(slot, history)
            if logits is None:
                stepping.append(i)
            else:
                drafts[i, 0] = np.argmax(logits)
        for step in range(drafts.shape[1]):
            # step 0 runs each caught-up row's last token; later steps its last draft
            going = stepping if step == 0 else [i for i, r in enumerate(rows) if r[2] > step]
            if not going:
                continue
            last = drafts[going, step - 1] if step else [rows[i][1][-1] for i in going]
            last = np.asarray(last, np.int64)
            slots = [rows[i][0] for i in going]
            logits = self.slots.decode(slots, last)
            self._held[slots, self._lengths[slots]] = last
            self._lengths[slots] += 1
            drafts[going, step] = np.argmax(logits, axis=1)
        return [drafts[i, :most] for i, (_, _, most) in enumerate(rows)]
