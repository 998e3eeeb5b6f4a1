"""What speculative decoding asks of the models it runs: a target that can score every drafted
token in one pass, and caches (target and draft) that can rewind rejected drafts."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, ModelError
from ..kv import CACHE_KINDS, KVLayout, plan_cache
from ..runtime.plan import Plan
from ..spec import PipelineSpec

_WHERE = "pipeline.strategy"


def plan_files(plan: Plan) -> str:
    return ", ".join(stage.io.file for stage in plan.stages)


def check_target(spec: PipelineSpec, plan: Plan) -> None:
    if plan.layout is None:
        raise ModelError(
            f"{plan_files(plan)}: the target declares no KV cache; speculative decoding rewinds it"
        )
    if plan.layout.new_rows:
        raise ModelError(
            f"{plan_files(plan)}: the target runs fixed chunks of {plan.layout.new_rows} tokens "
            "(a fixed-shape cache), so a verification pass cannot score every drafted token"
        )
    check_rewind(spec, plan.layout, "")
    logits = next(s.logits for s in plan.stages if s.logits is not None)
    if logits.rank != 3:
        raise ModelError(
            f"target logits {logits} give the last position only; verification scores every "
            "drafted token and needs [batch, seq, vocab] logits"
        )
    verify = spec.strategy.verify_session or spec.roles.get("target")
    if not verify:
        return
    if verify not in spec.sessions:
        raise ConfigError.at(f"{_WHERE}.verify.session", f"no session {verify!r}")
    model_dir = spec.model_dir or Path(".")
    files = {(model_dir / s.session.file).resolve() for s in plan.stages}
    if (model_dir / spec.sessions[verify].file).resolve() not in files:
        raise ConfigError.at(
            f"{_WHERE}.verify.session",
            f"session {verify!r} ({spec.sessions[verify].file}) is not a stage of the flow "
            "that decodes; the target is the flow's own decoder",
        )


def check_rewind(spec: PipelineSpec, layout: KVLayout, who: str) -> None:
    """Refuse a cache that cannot rewind rejected drafts: one the config makes slide, or a
    kind (named, or the one planned for ``layout``) that declares it cannot."""
    kv = spec.state.kv_cache
    if kv.sliding_window is not None and kv.sliding_window.slide_key_value_cache:
        raise ConfigError.at(
            "pipeline.state.kv_cache.sliding_window",
            f"the {who}cache slides (evicts old tokens) and cannot rewind rejected drafts; "
            "speculative decoding needs a cache that rewinds",
        )
    kind = plan_cache(layout, kv, spec.generation.past_present_share_buffer).kind
    if not CACHE_KINDS[kind].can_rewind:
        raise ConfigError.at(
            "pipeline.state.kv_cache.kind",
            f"the {who}cache kind {kind!r}{' (chosen by auto)' if kv.kind == 'auto' else ''} "
            "evicts and cannot rewind; speculative decoding needs one that "
            f"can ({', '.join(k for k, c in CACHE_KINDS.items() if c.can_rewind)})",
        )
