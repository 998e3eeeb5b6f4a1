"""The decode core both engines run: sequences in slots, batched decode calls, one token choice.

The OpenAI server (``server.engine``) and onnxruntime-genai's 0.18 Engine API
(``batching.engine``) schedule differently: the server admits requests continuously from its own
thread; the 0.18 API forms batches as the reference's static batch does and is pumped by
``run()``. Both bring their rows up to date, decode and choose tokens through ``DecodeCore``:
slots from ``batching.slots``, pickers from ``decoding.chain.make_picker`` (the one
token-choice path), EOS ids from the model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..adapters import Adapters
from ..decoding.chain import make_picker
from ..decoding.picker import TokenPicker
from ..decoding.processors import Processor
from ..decoding.stopping import StopPolicy, StopReason, StopRule
from ..model import Model
from ..spec import GenerationSpec
from ..speculative.adaptive import Probe
from .draft_model import BATCHED_CATCH_UP, BatchDraftModel, check_draft_model
from .slots import BatchedSlots, InterleavedSlots
from .speculation import (
    DRAFTED,
    OFFERED,
    DraftCost,
    DraftSteps,
    RowDrafts,
    RowOffer,
    SpeculationStats,
    WidthCosts,
    choose_width,
    fair_for_all,
)

log = logging.getLogger("genai_runtime.batching")

_NO_HISTORY = np.zeros((1, 0), np.int64)
_NO_DRAFTS = np.zeros(0, np.int64)
# The context the batch runner gives a model when its caller names none.
DEFAULT_MAX_CONTEXT = 2048
KV_MEMORY_SHARE = 0.5  # of the memory available at start, the most full-length KV rows may take


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``; None where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def context_that_fits(model: Model, rows: int) -> tuple[int, str]:
    """The context each of ``rows`` sequences gets when the caller names none: the model's own,
    unless ``rows`` full-length KV caches would take over ``KV_MEMORY_SHARE`` of the memory
    available now; and why, in words."""
    own = model.spec.generation.max_length
    layout = model.pipeline.plan.layout
    free = available_memory()
    if layout is None or free is None:
        return own, "the model's own"
    per_token = layout.bytes_per_token(rows)
    fits = int(free * KV_MEMORY_SHARE) // max(per_token, 1) // 256 * 256
    if fits >= own:
        return own, "the model's own"
    return max(fits, 256), (
        f"the model's own is {own}; {rows} rows of that would take "
        f"{own * per_token / 2**30:.1f} GiB of KV cache, over half of the "
        f"{free / 2**30:.1f} GiB available"
    )


class TokenHistory:
    """A sequence's tokens in one growing int64 buffer: appends in place, views without copies
    (the picker's processors read ``view()`` every step)."""

    def __init__(self, tokens: Any = (), capacity: int = 256):
        tokens = np.asarray(tokens, np.int64).ravel()
        self._buf = np.empty((1, max(capacity, 2 * tokens.size)), np.int64)
        self._len = 0
        self.extend(tokens)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> int:
        return int(self.array()[index])

    def _room(self, extra: int) -> None:
        if self._len + extra > self._buf.shape[1]:
            grown = np.empty((1, max(2 * self._buf.shape[1], self._len + extra)), np.int64)
            grown[0, : self._len] = self._buf[0, : self._len]
            self._buf = grown

    def append(self, token: int) -> None:
        self._room(1)
        self._buf[0, self._len] = token
        self._len += 1

    def extend(self, tokens: np.ndarray) -> None:
        self._room(tokens.size)
        self._buf[0, self._len : self._len + tokens.size] = tokens
        self._len += tokens.size

    def truncate(self, length: int) -> None:
        self._len = min(self._len, length)

    def view(self) -> np.ndarray:
        """``[1, len]``: what the picker's processors read."""
        return self._buf[:, : self._len]

    def array(self) -> np.ndarray:
        return self._buf[0, : self._len]


@dataclass(eq=False)
class Row:
    """One sequence in a slot: its tokens, how many of them the slot holds, how it picks."""

    history: TokenHistory
    picker: TokenPicker
    rng: np.random.Generator
    slot: int = -1
    adapter: str | None = None  # a LoRA adapter of the core's, by name (interleaved slots only)
    processed: int = 0  # leading tokens whose keys/values the slot holds
    logits: np.ndarray | None = None  # next-token logits, once the slot holds every token
    limit: int | None = None  # the most tokens the row may reach (prompt + budget)
    speculator: RowDrafts | None = None  # its lookup drafts, when the core speculates
    # drafts its caller proposed for the tokens after its history (the Engine API's
    # set_draft_tokens): verified by the next pass in place of lookup drafts
    offered: np.ndarray = field(default_factory=lambda: _NO_DRAFTS)
    # a verify pass's drafts not yet checked, and the logits after each of them
    drafts: np.ndarray = field(default_factory=lambda: _NO_DRAFTS)
    ahead: np.ndarray | None = None
    round: tuple[int, int, bool] | None = None  # (drafts verified, their bucket, a probe)
    kept: int = 0  # drafts of this round kept so far
    drafted: int = 0  # drafts verified over the row's life
    accepted: int = 0  # of them, kept
    emitted: int = 0  # tokens chosen over the row's life
    spent: float = 0.0  # what the passes it decoded in cost, in one-token steps

    @property
    def pending(self) -> int:
        """Tokens still to run through the model."""
        return len(self.history) - self.processed


class Choice(NamedTuple):
    token: int
    complete: bool  # a grammar cannot go on after this token
    logits: np.ndarray | None  # the model's row it was chosen from (when asked for)


class DecodeCore:
    """Slots over one model plus the steps every engine takes with them.

    ``batched=None`` picks ``BatchedSlots`` when the model allows it (one onnxruntime call for
    every row), else ``InterleavedSlots``; loaded LoRA ``adapters`` need interleaved slots (one
    batched call runs every row with the same tensors). ``min_rows`` is the fewest rows a
    batched decode call runs when the caller names no span (the server: 2, see ``BatchedSlots``).
    ``stop_policy``: what the engine does with the stop rule's answers (``stops``).
    ``speculate``: the most prompt-lookup drafts a row verifies per pass (0: none;
    ``batching.speculation``); needs batched slots on the host, which then load a second,
    per-row verify session. ``draft``: a smaller model of the same vocabulary whose greedy
    tokens are the drafts in place of lookups (``batching.draft_model``).
    """

    def __init__(
        self,
        model: Model,
        *,
        num_slots: int,
        context: int,
        batched: bool | None = None,
        min_rows: int = 2,
        adapters: Adapters | None = None,
        stop_policy: StopPolicy | None = None,
        speculate: int = 0,
        draft: Model | None = None,
    ):
        self.model = model
        self.context = context
        why = BatchedSlots.supports(model)
        if adapters is not None and adapters.names():
            why = "LoRA adapters are loaded"
            batched = False if batched is None else batched
        if batched is None:
            batched = why is None
        elif batched and why is not None:
            log.warning("batched decode unavailable (%s); interleaving requests", why)
            batched = False
        self.speculate = speculate
        self.speculation_note = "off" if speculate <= 0 else ""
        if batched:
            self.slots = BatchedSlots(
                model, num_slots, context, min_rows=min_rows, verify=speculate > 0
            )
            if speculate > 0 and self.slots.verify_obstacle is not None:
                self.speculation_note = f"off: {self.slots.verify_obstacle}"
        else:
            if speculate > 0:
                self.speculation_note = f"off: requests are interleaved ({why})"
            self.slots = InterleavedSlots(model, num_slots, context, adapters, min_rows=min_rows)
        if self.speculation_note:
            if speculate > 0:
                log.warning("speculation %s", self.speculation_note)
            self.speculate = 0
        self.drafter: BatchDraftModel | None = None
        if self.speculate and draft is not None:
            check_draft_model(model, draft)
            self.drafter = BatchDraftModel(draft, num_slots, context)
            self.speculation_note = f"draft model {self.drafter.name}, up to {speculate} drafts"
        elif self.speculate:
            self.speculation_note = f"prompt lookup, up to {speculate} drafts per row"
        self._draft_cost = DraftCost()
        self.speculation = SpeculationStats()
        self._costs = WidthCosts()
        self._probe = Probe()
        self._probing = False
        self._draft_probed = False  # the last draft-model round was a probe
        self.vocab_size = model.vocab_size
        self.stops = StopRule(model.spec.tokens.eos, self.vocab_size or 0, stop_policy)
        self.eos = self.stops.eos

    def picker(
        self,
        generation: GenerationSpec,
        *,
        grammar: Processor | None = None,
        guidance: tuple[str, str] | None = None,
        request_ops: Sequence[Processor] = (),
    ) -> TokenPicker:
        """A token picker for one sequence: ``generation``'s search options and, optionally, a
        built ``grammar`` or a ``guidance`` (type, data) pair compiled against the model's
        tokenizer."""
        model_dir = self.model.spec.model_dir
        return make_picker(
            generation, eos_token_ids=sorted(self.eos), vocab_size=self.vocab_size,
            guidance=guidance, grammar_op=grammar, request_ops=request_ops,
            tokenizer_json=None if model_dir is None else model_dir / "tokenizer.json",
        )  # fmt: skip

    def place(self, row: Row, slot: int) -> None:
        """Put ``row`` in ``slot``, whose first ``row.processed`` tokens it may reuse."""
        row.slot = slot
        row.logits = None
        if self.speculate and row.speculator is None:
            row.speculator = RowDrafts(self.speculate)
        self.slots.rewind(slot, row.processed)

    def advance(self, rows: list[Row], span: range | None = None) -> None:
        """Run every row's pending tokens so each holds its next-token logits. Rows with several
        pending tokens prefill one by one; rows with one decode together in one call over
        ``span`` (see ``BatchedSlots.decode``)."""
        single = []
        for row in rows:
            if row.pending > 1:
                tokens = row.history.array()[row.processed :]
                row.logits = self.slots.prefill(row.slot, tokens, row.processed, row.adapter)
                row.processed = len(row.history)
                if self.drafter is not None and row.speculator is not None:  # as the model
                    self.drafter.prefill(row.slot, row.history.array())
            elif row.pending == 1:
                single.append(row)
        if not single:
            return
        width, proposals = self._width(single) if self.speculate else (1, {})
        if width > 1:  # rows near the end of the context leave no room for a wide pass
            width = max(1, min(width, self.slots.verify_room([r.slot for r in single], span)))
        if self.speculate:
            cost = self._costs.ratio(len(single), width)
            for row in single:
                row.spent += cost
        slots = [row.slot for row in single]
        started = time.perf_counter()
        if width == 1:  # the decoder's own session: a verify pass costs more per row
            tokens = np.array([row.history[-1] for row in single], np.int64)
            logits = self.slots.decode(slots, tokens, span)
            for row, values in zip(single, logits):
                row.logits = values
                row.processed += 1
        else:
            feeds = []
            for row in single:
                drafts, _ = proposals.get(id(row), (_NO_DRAFTS, 0))
                feeds.append(np.concatenate([[row.history[-1]], drafts[: width - 1]]))
            scored = self.slots.verify(slots, feeds, span)
            for row, feed, rows in zip(single, feeds, scored):
                row.logits, row.ahead, row.drafts = rows[0], rows[1:], feed[1:]
                row.offered = _NO_DRAFTS  # now this round's drafts
                row.processed += 1
                row.kept = 0
                if row.drafts.size:
                    bucket = proposals[id(row)][1]
                    row.round = (int(row.drafts.size), bucket, self._probing)
        if self.speculate:
            self._costs.timed(len(single), width, time.perf_counter() - started)
            if width == 1:
                self.speculation.plain_steps += 1
            else:
                self.speculation.passes += 1

    def _width(self, rows: list[Row]) -> tuple[int, dict[int, tuple[np.ndarray, int]]]:
        """The next pass's tokens per row and each drafting row's (drafts, bucket), by id."""
        proposals: dict[int, tuple[np.ndarray, int]] = {}
        drafting: list[tuple[Row, int]] = []  # rows the draft model may draft for, and how many
        for row in rows:
            if row.speculator is None or row.picker.grammar is not None:
                continue
            limit = self.context if row.limit is None else min(row.limit, self.context)
            most = min(self.speculate, limit - len(row.history) - 1)
            if row.offered.size:
                drafts, bucket = row.offered[: max(most, 0)], OFFERED
            elif self.drafter is not None:
                if most > 0:
                    drafting.append((row, most))
                continue
            else:
                drafts, bucket = row.speculator.propose(row.history.array(), most)
            if drafts.size:
                proposals[id(row)] = (drafts, bucket)
        self._probing = False
        if drafting:
            self._draft(rows, drafting, proposals)
        if not proposals:
            return 1, proposals
        # drafts a caller proposed (or a draft model made) are verified whole: they are paid for
        asked = max((d.size for d, b in proposals.values() if b in (OFFERED, DRAFTED)), default=0)
        offers = []
        for row in rows:
            drafts, bucket = proposals.get(id(row), (_NO_DRAFTS, 0))
            offers.append(RowOffer(row.speculator if drafts.size else None, int(drafts.size),
                                   bucket, row.emitted, row.spent))  # fmt: skip
        width = max(choose_width(offers, self._costs, self.speculate), asked + 1)
        if width == 1 and fair_for_all(offers, self._costs, 2) and self._probe.due():
            width, self._probing = 2, True
            self.speculation.probes += 1
        return width, proposals

    def _draft(self, rows: list[Row], drafting: list[tuple[Row, int]], proposals: dict) -> None:
        """Run the draft model for ``drafting`` when the drafts it would make are expected to
        beat plain steps, counting its own steps: one per draft, and those it takes to catch up
        on the tokens since its last round beyond the last (a row far behind prefills, priced
        as ``BATCHED_CATCH_UP`` steps). When they do not pay, a one-draft probe now and then,
        within each row's slack; its wait doubles while drafting still does not pay after it."""
        per_draft = self._draft_cost.ratio(self._costs, len(rows))
        lag = max(self.drafter.lag(row.slot, len(row.history)) for row, _ in drafting)
        catch_up = per_draft * (min(lag, BATCHED_CATCH_UP) - 1)  # steps beyond one per draft
        steps = DraftSteps(per_draft, catch_up)
        most = dict((id(row), n) for row, n in drafting)
        offers = [RowOffer(row.speculator if id(row) in most else None, most.get(id(row), 0),
                           DRAFTED, row.emitted, row.spent) for row in rows]  # fmt: skip
        k = choose_width(offers, self._costs, self.speculate, steps) - 1
        if self._draft_probed:  # a probe succeeds when drafting pays after it
            self._probe.result(k)
            self._draft_probed = False
        fair = fair_for_all(offers, self._costs, 2, steps)
        if k == 0 and fair and self._probe.due():
            k, self._draft_probed = 1, True
            self.speculation.probes += 1
        if k == 0:
            return
        started = time.perf_counter()
        asked = [(row.slot, row.history.array(), min(n, k)) for row, n in drafting]
        drafts = self.drafter.propose(asked)
        seconds = time.perf_counter() - started
        if not self.drafter.prefilled:  # every step batched: a step's cost
            self._draft_cost.timed(self.drafter.steps, seconds)
        step = self._costs.seconds.get((len(rows), 1))
        spent = seconds / step if step else per_draft * k + catch_up
        for row in rows:
            row.spent += spent
        for (row, _), tokens in zip(drafting, drafts):
            proposals[id(row)] = (tokens, DRAFTED)

    def offer(self, row: Row, drafts: np.ndarray) -> None:
        """The tokens ``row``'s caller expects after its history: its next pass verifies them
        (up to ``speculate``), and each chosen token that differs from them drops the rest."""
        row.offered = np.asarray(drafts, np.int64)[: self.speculate]

    def follow(self, row: Row) -> bool:
        """After a chosen token joined ``row``'s history: when it is the next draft the verify
        pass scored, the row's logits become those after it and True is returned (choose
        again); otherwise the round ends (``settle``) and False is returned."""
        if row.ahead is not None and row.drafts.size and row.history[-1] == int(row.drafts[0]):
            row.processed += 1
            row.logits, row.ahead, row.drafts = row.ahead[0], row.ahead[1:], row.drafts[1:]
            row.kept += 1
            return True
        self.settle(row)
        return False

    def settle(self, row: Row) -> None:
        """End the row's verify round: unchecked drafts leave its slot, the rates learn how
        many were kept."""
        if row.round is not None:
            proposed, bucket, probe = row.round
            row.speculator.kept(row.kept, proposed, bucket)
            row.drafted += proposed
            row.accepted += row.kept
            self.speculation.proposed += proposed
            self.speculation.accepted += row.kept
            if probe:
                self._probe.result(row.kept)
            row.round = None
        if row.ahead is not None:
            row.ahead, row.drafts = None, _NO_DRAFTS
            self.slots.rewind(row.slot, row.processed)

    def choose(self, row: Row, *, keep_logits: bool = False) -> Choice:
        """The row's next token from its logits (consumed) through its picker, committed to the
        picker's grammar. ``keep_logits``: also return the model's own row, as it came from the
        model (no bias, penalty or grammar mask: what logprobs report)."""
        logits = row.logits[None, :]
        row.logits = None
        model = logits[0].copy() if keep_logits else None  # the picker's ops work in place
        picker = row.picker
        history = row.history.view() if picker.ops else _NO_HISTORY
        token = int(picker.pick(history, logits, row.rng)[0])
        row.emitted += 1
        if row.offered.size:  # the caller's drafts hold while the choices follow them
            row.offered = row.offered[1:] if token == row.offered[0] else _NO_DRAFTS
        complete = picker.commit(np.array([token], np.int32))
        complete = complete is not None and bool(complete[0])
        return Choice(token, complete, model)

    def stop_after(
        self,
        row: Row,
        token: int,
        *,
        generated: int,
        budget: int | None,
        context: int,
        complete: bool = False,
        stop_string: Callable[[], bool] | None = None,
    ) -> StopReason | None:
        """The stop rule's answer for ``row`` after its chosen ``token`` (``generated`` counts
        it). The token joins the row's history unless it is an EOS the engine's policy keeps
        out of the output."""
        reason = self.stops.check(
            token, generated=generated, length=len(row.history) + 1, budget=budget,
            context=context, complete=complete, stop_string=stop_string,
        )  # fmt: skip
        if reason is not StopReason.EOS or self.stops.policy.eos_is_output:
            row.history.append(token)
        return reason
