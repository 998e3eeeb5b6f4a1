"""A loaded pipeline: a spec's sessions created, their I/O read, the plan checked against them.

Everything that runs a pipeline starts here: ``Model``, a speculative draft model, the server's
slots and ``validate``. It owns the two things those used to rebuild by hand: the KV plan (the
cache kind chosen for the plan's layout, worked out once) and the executor (``executor(batch,
max_length)``, the one place an ``Executor`` is made). mlx-lm's ``make_prompt_cache(model)`` is
the same idea at small scale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import onnxruntime as ort

from ..errors import ConfigError
from ..kv import KVPlan, plan_cache
from ..session.graph_io import SessionIO
from ..spec import PipelineSpec
from .confirm import config_problems
from .executor import Executor
from .plan import Plan, build_plan
from .sessions import load_sessions, takes_turns


@dataclass(frozen=True, eq=False)
class LoadedPipeline:
    spec: PipelineSpec
    sessions: Mapping[str, ort.InferenceSession]
    ios: Mapping[str, SessionIO]
    plan: Plan
    # Several sessions run on every token (a pipeline, or a draft beside its target): their
    # thread pools park after each run (see ``sessions.takes_turns``).
    takes_turns: bool
    _kv_plans: dict[bool, KVPlan] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls,
        spec: PipelineSpec,
        names: Iterable[str] | None = None,
        *,
        trust: bool = False,
        turns: bool | None = None,
        require_logits: bool = False,
        source: str | None = None,
        confirm: bool = True,
    ) -> LoadedPipeline:
        """Create the sessions of ``names`` (default: the flow's), raise the first failure, and
        check the config's facts (vocabulary, token ids) against the graphs.

        ``turns``: these sessions take turns with others on every token (None: decided from
        the spec); ``require_logits=False`` loads exports without an lm_head (a Generator then
        names the gap); ``source`` names the config in errors; ``confirm=False`` skips the token-id
        checks (a draft graph borrowing its target's config)."""
        if names is None:
            names = dict.fromkeys(step.run for step in spec.flow)
        turns = takes_turns(spec) if turns is None else turns
        sessions, ios, errors = load_sessions(spec, names, trust=trust, turns=turns)
        if errors:
            raise errors[0]
        pipeline = cls.of(spec, sessions, ios, require_logits=require_logits, turns=turns)
        problems = config_problems(spec, pipeline.plan) if confirm else []
        if problems:
            raise ConfigError(problems, source)
        return pipeline

    @classmethod
    def of(
        cls,
        spec: PipelineSpec,
        sessions: Mapping[str, ort.InferenceSession],
        ios: Mapping[str, SessionIO],
        *,
        require_logits: bool = True,
        turns: bool | None = None,
    ) -> LoadedPipeline:
        """Plan sessions already created (``validate`` creates every one to report them all)."""
        plan = build_plan(spec, ios, require_logits=require_logits)
        return cls(spec, sessions, ios, plan, takes_turns(spec) if turns is None else turns)

    def kv_plan(self, share_buffer: bool | None = None) -> KVPlan | None:
        """The cache kind for the plan's layout (None: no self-attention cache), worked out once
        per ``past_present_share_buffer`` value (default: the config's)."""
        if self.plan.layout is None:
            return None
        if share_buffer is None:
            share_buffer = self.spec.generation.past_present_share_buffer
        plan = self._kv_plans.get(share_buffer)
        if plan is None:
            kv = self.spec.state.kv_cache
            plan = self._kv_plans[share_buffer] = plan_cache(self.plan.layout, kv, share_buffer)
        return plan

    @property
    def vocab_size(self) -> int | None:
        return self.plan.vocab_size

    def executor(
        self, batch_size: int, max_length: int, *, share_buffer: bool | None = None
    ) -> Executor:
        """A fresh executor (its own buffers and KV cache) over these sessions."""
        tokens = self.spec.tokens
        return Executor(
            self.plan,
            self.sessions,
            self.kv_plan(share_buffer),
            batch_size=batch_size,
            max_length=max_length,
            pad_token_id=tokens.pad,
            tokens=tokens,
        )
