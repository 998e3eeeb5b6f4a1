"""Structural router: classify a pipeline by its shape alone, with the reasons for the verdict.

Which sessions run in which phase, how wires connect them, whether a stage attends to another's
output, what the strategy is. ``model.type`` / ``metadata.model_type`` is never consulted, so a
decoder with a type string nobody has heard of still routes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import PipelineSpec

ROUTES = (
    "decoder",
    "decoder-pipeline",
    "prefill-decode",
    "encoder-decoder",
    "multimodal",
    "speculative",
    "plugin",
)


@dataclass(frozen=True)
class Route:
    kind: str
    reasons: tuple[str, ...]
    base: str | None = None  # for speculative / plugin: the shape underneath

    def __str__(self) -> str:
        return self.kind if not self.base else f"{self.kind} (over {self.base})"


def classify(spec: PipelineSpec) -> Route:
    kind, reasons = _shape(spec)
    if spec.plugin is not None:
        where = spec.plugin.library or spec.plugin.module
        return Route("plugin", (f"pipeline.plugin loads {where!r}", *reasons), base=kind)
    if spec.strategy.kind == "speculative":
        s = spec.strategy
        producer = s.producer or "draft_model"
        by = f" session {s.draft_session!r}" if s.draft_session else ""
        k = s.num_speculative_tokens
        why = f"strategy.kind is speculative: {producer}{by} proposes {k} tokens"
        verify = s.verify_session or spec.roles.get("target")
        if verify:
            why += f", {verify!r} verifies"
        return Route("speculative", (why, *reasons), base=kind)
    return Route(kind, tuple(reasons))


def _shape(spec: PipelineSpec) -> tuple[str, list[str]]:
    init = [s.run for s in spec.steps("init")]
    step = spec.steps("step")
    names = [s.run for s in step]
    reasons = [f"{len(step)} session(s) run every step: {', '.join(names) or '(none)'}"]
    if init:
        reasons.append(f"{len(init)} session(s) run once per input (init): {', '.join(init)}")
    cross = [s for s in step if s.cross_attention_from]
    if cross or spec.state.cross_cache is not None:
        src = cross[0].cross_attention_from if cross else spec.state.cross_cache.source
        dst = cross[0].run if cross else names[-1] if names else "?"
        reasons.append(f"{dst!r} cross-attends to the output of {src!r}")
        return "encoder-decoder", reasons
    if init:
        fed = sorted({w.dst for w in spec.dataflow if w.src in init})
        if fed:
            reasons.append(f"init outputs are wired into: {', '.join(fed)}")
        return "multimodal", reasons
    prompt_only = [s.run for s in step if not s.run_on_token_gen]
    token_only = [s.run for s in step if not s.run_on_prompt]
    if prompt_only and token_only:
        reasons.append(
            f"{', '.join(prompt_only)} runs on the prompt only; "
            f"{', '.join(token_only)} on new tokens only"
        )
        return "prefill-decode", reasons
    if len(step) > 1:
        chain = [str(w) for w in spec.dataflow if w.src in names and w.dst in names]
        reasons.append("stages chained by wires: " + ("; ".join(chain) or "(none)"))
        return "decoder-pipeline", reasons
    if not step:
        reasons.append("no stage runs in phase 'step'")
        return "none", reasons
    reasons.append("no init stage and no cross-attention: a single autoregressive decoder")
    return "decoder", reasons
