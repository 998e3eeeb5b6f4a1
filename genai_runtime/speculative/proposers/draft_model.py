"""A smaller decoder drafting autoregressively with its own sessions, executor and KV cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...config import load
from ...decoding.sampling import draw
from ...errors import ModelError
from ...runtime.driver import forward_rows
from ...runtime.pipeline import LoadedPipeline
from ...spec import FlowStep, KVCacheSpec, StrategySpec, frozen_map
from ..target import check_rewind, plan_files
from .base import EMPTY, Proposal, ranked

if TYPE_CHECKING:
    from ...decoding.picker import TokenPicker
    from ...runtime.driver import DriverSetup
    from ...runtime.executor import Executor
    from ..spec import SpeculativeSpec


class DraftModelProposer:
    """It catches up on tokens it has not seen (the last round's bonus token, a prompt), drafts
    k tokens (argmax, or sampled from its own distribution for rejection sampling) and, told how
    many were kept, rewinds its cache to the kept prefix.
    """

    free = False  # a run per drafted token: K is sized before proposing

    def __init__(
        self,
        draft: LoadedPipeline,
        *,
        max_length: int,
        picker: TokenPicker | None,
        rng: np.random.Generator | None,
    ):
        self.exec = draft.executor(1, max_length)
        self.max_length = max_length
        self.picker = picker  # None: greedy drafts; else drafts sampled from its distribution
        self.rng = rng
        self.vocab = draft.vocab_size
        self._base = 0
        self._k = 0
        self._ids = np.zeros((1, 1), np.int32)
        self._fed = np.zeros(max_length, np.int32)  # the tokens its cache holds, by position

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        """``widths``: rank that many candidates per depth along the argmax path (a token
        tree; its drafts are then deterministic point masses, also when sampling)."""
        length = context.shape[0]
        k = min(k, self.max_length - length)
        ex = self.exec
        if k <= 0:
            return Proposal(EMPTY)
        held = min(ex.length, length)
        differ = np.flatnonzero(self._fed[:held] != context[:held])
        if differ.size or ex.length >= length:  # a rewound or edited sequence: drop the rest
            ex.rewind_to(min(int(differ[0]) if differ.size else held, length - 1))
        tokens = np.empty(k, np.int32)
        sampled = self.picker is not None and widths is None
        probs = np.zeros((k, self.vocab), np.float64) if sampled else None
        candidates = [] if widths is not None else None
        row = self._run(context[ex.length : length])
        for i in range(k):
            if candidates is not None:
                candidates.append(ranked(row, widths[i]))
                tokens[i] = candidates[-1][0]
            elif probs is None:
                tokens[i] = int(np.argmax(row))
            else:
                ids, p = self.picker.distribution(row)
                probs[i, ids] = p
                tokens[i] = draw(ids, p, self.rng)
            if i + 1 < k:
                self._ids[0] = tokens[i]
                row = self._run(self._ids[0])
        self._base, self._k = length, k
        return Proposal(tokens, probs, candidates=candidates)

    def _run(self, tokens: np.ndarray) -> np.ndarray:
        """Logits ``[V]`` after the last of ``tokens``."""
        start = self.exec.length
        self._fed[start : start + tokens.shape[0]] = tokens
        return forward_rows(self.exec, tokens, what="draft model", last_only=True)

    def observe(self, num_accepted: int) -> None:
        # Drafts 1..k-1 were fed to the draft model; the kept ones stay in its cache.
        self.exec.rewind_to(self._base + min(num_accepted, self._k - 1))

    def observe_target(self, executor: Executor, row: int) -> None:
        """The draft reads only the token ids."""

    def on_rewind(self, length: int) -> None:
        """``propose`` compares what its cache holds with the context it is given."""


@dataclass(frozen=True)
class DraftModelSource:
    """The draft's own loaded pipeline."""

    draft: LoadedPipeline

    @classmethod
    def load(cls, target: LoadedPipeline, spec: SpeculativeSpec, trust: bool) -> DraftModelSource:
        draft = _load_draft(target, spec.draft_session)
        dplan, plan = draft.plan, target.plan
        if dplan.vocab_size != plan.vocab_size:
            raise ModelError(
                f"draft {plan_files(dplan)} has vocabulary size {dplan.vocab_size} but target "
                f"{plan_files(plan)} has {plan.vocab_size}: they must share one vocabulary"
            )
        if dplan.layout is not None:
            check_rewind(draft.spec, dplan.layout, "draft ")
        return cls(draft)

    def make(self, spec: SpeculativeSpec, setup: DriverSetup) -> DraftModelProposer:
        picker = None if setup.picker.is_greedy else setup.picker
        return DraftModelProposer(
            self.draft, max_length=setup.max_length, picker=picker, rng=setup.rng
        )

    def describe(self) -> list[str]:
        stages = len(self.draft.plan.stages)
        return [f"draft model: {self.draft.spec.model_dir} ({stages} stage(s))"]


def _load_draft(target: LoadedPipeline, session: str) -> LoadedPipeline:
    """The draft decoder for session ``session``: the whole model in the folder that holds its
    file when that folder has its own genai_config.json (a separately exported draft model),
    else that one graph as a single-stage decoder with the target's KV naming."""
    spec = target.spec
    model_dir = spec.model_dir or Path(".")
    path = (model_dir / spec.sessions[session].file).resolve()
    folder = path.parent
    if folder != Path(model_dir).resolve() and (folder / "genai_config.json").is_file():
        # The draft runs between the target's passes: one thread pool for both.
        return LoadedPipeline.load(load(folder), turns=True, source=str(folder))
    kv = spec.state.kv_cache
    kv = KVCacheSpec(
        kind=kv.kind, num_kv_heads=kv.num_kv_heads, head_size=kv.head_size, format=kv.format
    )
    draft_spec = dataclasses.replace(
        spec,
        sessions=frozen_map({session: spec.sessions[session]}),
        flow=(FlowStep(run=session),),
        dataflow=(),
        roles=frozen_map(),
        strategy=StrategySpec(),
        state=dataclasses.replace(spec.state, kv_cache=kv),
    )
    # Its token ids are the target's: the vocabulary check below says more than theirs would.
    return LoadedPipeline.load(
        draft_spec, [session], turns=target.takes_turns, require_logits=True, confirm=False
    )
